// A worker: one model replica on one device, in role prefill, decode or both.
// The flags fill WorkerServerOptions; WorkerServer (worker_server.h) does
// the rest.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "common/controller_client/member_address.h"
#include "common/logging/log.h"
#include "common/service/service_runtime.h"
#include "common/status/status_macros.h"
#include "services/worker/worker_server.h"
#include "services/worker/worker_services.h"

ABSL_FLAG(std::string, device, "cpu", "Where the model runs: 'cpu' or 'cuda:N'.");
ABSL_FLAG(bool, generated_weights, false,
          "Benchmarks: compute the weights in memory from --model's generated_weights.json "
          "(make_model --preset=P --weights=false) instead of reading safetensors: the preset's "
          "random weights, bit for bit what make_model would write.");
ABSL_FLAG(int32_t, tensor_parallel, 1,
          "CUDA: split the model over this many GPUs (tensor parallelism), rank r on cuda:N+r "
          "of --device=cuda:N; the GPUs need peer access (NVLink or PCIe P2P). One process, one "
          "engine and scheduler, one gRPC identity. KV moves to and from workers of any TP "
          "degree over the KV transports; CPU attention services take none of its sequences.");
ABSL_FLAG(std::string, role, "both",
          "Initial role: 'prefill', 'decode' or 'both' (colocated). WorkerControl.SetRole (the "
          "controller) changes it at run time; without a KV transport only 'both' can be set.");
ABSL_FLAG(std::string, model, "",
          "Directory of a Hugging Face Llama-family model (config.json, *.safetensors, "
          "tokenizer.json).");
ABSL_FLAG(std::string, model_name, "",
          "Name the model is served under (GenerateRequest.model, ModelInfo); default: the "
          "model directory's name.");
ABSL_FLAG(std::string, dtype, "f32",
          "CPU backend precision: 'f32', or 'bf16' (bf16 weights, matmul inputs and KV cache; "
          "fp32 accumulation).");
ABSL_FLAG(std::string, bf16_activations, "round",
          "With --dtype=bf16: 'round' matmul inputs to bf16 (fastest, the usual bf16 numerics) "
          "or 'split' them into two bf16 terms (near-f32 accuracy; matmuls do twice the work).");
ABSL_FLAG(int64_t, kv_cache_mb, 512, "CPU backend: host memory for the paged KV cache, in MiB.");
ABSL_FLAG(double, gpu_memory_fraction, 0.9,
          "CUDA backend: share of the device's memory for weights, workspace and the KV cache "
          "(the KV cache gets what the rest leaves), counted from what is free at start-up: two "
          "workers of 0.45 share one device.");
ABSL_FLAG(int32_t, gpu_kv_cache_tokens, 0,
          "CUDA backend: cap the KV cache at this many tokens (0: whatever "
          "--gpu_memory_fraction leaves); with --attention_services, sequences beyond it are "
          "offloaded to the CPU instead of waiting.");
ABSL_FLAG(bool, cuda_graphs, true,
          "CUDA backend: replay decode steps from CUDA graphs, one per batch-size bucket (1, 2, "
          "4, 8, then multiples of 16) and context bucket (powers of two), all captured at "
          "start-up (the log says how many, how long, and the memory they took); none is "
          "captured while serving (false: launch every kernel every step).");
ABSL_FLAG(int32_t, cuda_graph_max_batch, 0,
          "CUDA backend: largest padded decode batch with a graph (0: --max_running); "
          "larger decode steps launch their kernels one by one "
          "(trident_worker_cuda_graph_misses_total).");
ABSL_FLAG(int32_t, cuda_graph_max_context, 0,
          "CUDA backend: longest context with a decode graph (0: the context window); steps "
          "with longer contexts launch their kernels one by one.");
ABSL_FLAG(bool, cuda_gemv, true,
          "CUDA backend: single-sequence decode steps run their projections on Trident's "
          "weight-streaming GEMV kernel instead of cuBLASLt (false: cuBLASLt for all).");
ABSL_FLAG(
    bool, cuda_gemm_skinny, false,
    "CUDA backend: on sm_90 (H100, H200) decode batches of 2-64 sequences run their "
    "projections on Trident's skinny GEMM (weights streamed once by the tensor copy engine "
    "into wgmma, the MLP's activation fused) instead of cuBLASLt; slower than cuBLASLt so "
    "far, except for the MLP's fused gate/up of up to 64 sequences, which takes it regardless "
    "(bench/RESULTS.md).");
ABSL_FLAG(int32_t, cuda_gemm_tune_algos, 16,
          "CUDA backend: decode batches whose projections run on cuBLASLt time up to this many "
          "of its candidate algorithms per shape while the decode graphs are captured at "
          "start-up, and keep the fastest (about 1 s more start-up for the 8B shape; "
          "1-2% shorter steps at 64-128 sequences on an H200, bench/RESULTS.md). Timing may "
          "pick differently in another process, so bits may differ between restarts; 0: "
          "cuBLASLt's heuristic's first choice, the same in every process.");
ABSL_FLAG(bool, cuda_gemv_bulk, true,
          "CUDA backend: on sm_90 (H100, H200) that GEMV streams the weights through shared "
          "memory with the bulk copy engine, the MLP's activation fused into the gate/up "
          "projection (false: the register-streaming GEMV, k up to 8192, and cuBLASLt beyond).");
ABSL_FLAG(bool, cuda_gemv_fusions, true,
          "CUDA backend: on sm_90 that GEMV also computes the RMSNorm ahead of the q/k/v, "
          "gate/up and LM head projections, and RoPE and the bf16 KV append after q/k/v, so "
          "those launch no kernel of their own; the same bits either way (false: the separate "
          "kernels).");
ABSL_FLAG(bool, cuda_gemv_dynamic, true,
          "CUDA backend: on sm_90 that GEMV hands its items of 8 weight rows to its CTAs as they "
          "ask, so the grid ends together (false: a fixed run per CTA; the same bits).");
ABSL_FLAG(bool, cuda_decode_stable_prefix, true,
          "CUDA backend: with --cuda_pdl_chain, decode attention copies the cached positions "
          "before the step's token while the q/k/v projection ahead of it still runs (false: "
          "it waits for that projection before any load).");
ABSL_FLAG(bool, cuda_pdl_chain, true,
          "CUDA backend: launch the norms, RoPE, the KV append, SwiGLU and decode attention with "
          "programmatic dependent launch too, so that each kernel of a step is scheduled before "
          "the one ahead of it ends (the projections always are; false: only they are).");
ABSL_FLAG(int32_t, kv_block_size, 16, "Tokens per KV cache block.");
ABSL_FLAG(std::string, kv_cache_dtype, "bf16",
          "CUDA backend: the KV cache's element type, 'bf16' or 'fp8_e4m3' (FP8 E4M3 with a scale "
          "per token and kv head: half the bytes per token, so about twice the tokens in the "
          "pool; needs --kv_block_size a multiple of 16; serves no CPU-resident sequences, so "
          "not with --attention_services). Prefill and decode workers exchanging KV must agree.");
ABSL_FLAG(int32_t, cpu_threads, 0,
          "Threads for the CPU backend; 0: one per physical core the process may use.");
ABSL_FLAG(bool, pin_threads, true, "Pin each CPU backend thread to one core.");
ABSL_FLAG(int32_t, max_batch_tokens, 2048,
          "Token budget of one forward pass (prefill chunks plus decode tokens).");
ABSL_FLAG(int32_t, max_prefill_tokens_while_decoding, 256,
          "While sequences decode, prompt chunks take at most this many tokens of a step, so a "
          "long prompt arriving stretches the decoders' next token (their ITL) by a bounded "
          "chunk rather than by its whole prefill; 0: only --max_batch_tokens caps them.");
ABSL_FLAG(int32_t, max_prefill_tokens_when_backlogged, 1024,
          "While at least --prefill_backlog_tokens prompt tokens wait to be computed, prompt "
          "chunks may take this many tokens of a step beside decoding sequences instead of "
          "--max_prefill_tokens_while_decoding: under overload the backlog is prefilled in "
          "larger, more efficient chunks, at the cost of the decoders' inter-token latency in "
          "those steps (trident_worker_backlogged_steps_total counts them). Below saturation no "
          "step is backlogged; 0: never.");
ABSL_FLAG(int32_t, prefill_backlog_tokens, 4096,
          "Prompt tokens waiting to be computed from which --max_prefill_tokens_when_backlogged "
          "applies.");
ABSL_FLAG(int32_t, max_running, 256, "Most sequences in the running batch.");
ABSL_FLAG(bool, prefix_caching, true,
          "Reuse the KV of cached prompt prefixes: finished sequences' full blocks stay cached "
          "(LRU) until the pool needs them, and a new prompt computes only what its longest "
          "cached prefix lacks. False: every prompt is computed whole.");
ABSL_FLAG(int32_t, shared_prefix_wait_steps, 8,
          "With --prefix_caching: a waiting prompt whose next uncached block a running request "
          "is still computing waits for it, at most this many engine steps (prompts behind it go "
          "ahead), so that a new shared prefix is computed once. 0: strict arrival order.");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Context window cap in tokens; 0: the model's max_position_embeddings.");
ABSL_FLAG(std::string, worker_id, "",
          "Id this worker reports in load samples and KV endpoints; empty: worker-<pid>.");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port peers use to reach this worker (KvDestination.decode_address) and that it "
          "registers with the controller (its host also names the /metrics endpoint there); "
          "empty: peers use the address they know it by, and the controller gets --host (or, "
          "when that is a wildcard, the host name) with the bound ports.");
ABSL_FLAG(std::string, controller_address, "",
          "host:port of the controller: once serving, the worker registers there (id, "
          "incarnation, --advertise_address, device, model, role, capacity; node name from "
          "$NODE_NAME, else the host name) and heartbeats its load, re-registering when the "
          "controller restarts, and deregisters on shutdown. Empty: no controller.");
ABSL_FLAG(std::string, kv_transport, "auto",
          "How KV moves between prefill and decode workers: 'ucx' (one-sided puts into the "
          "decode worker's registered KV pool), 'none' (no disaggregation: ReserveKv and "
          "Prefill with a destination answer FAILED_PRECONDITION), or 'auto': ucx for roles "
          "prefill and decode, none for both.");
ABSL_FLAG(std::string, ucx_transports, "^sysv",
          "UCX transports to use (the UCX_TLS syntax, e.g. 'tcp' or 'posix,cma'); empty: UCX's "
          "own choice. The default leaves out sysv shared memory, which UCX 1.13 can leave "
          "unable to receive from new peers after a peer dies.");
ABSL_FLAG(int64_t, kv_staging_mb, 256,
          "KV pool in device memory that UCX cannot register (UCX without CUDA support): MiB "
          "of pinned host memory the prefill side stages outgoing KV through, in slots of 16 "
          "MiB; a transfer waits for a free slot when all are in flight.");
ABSL_FLAG(int32_t, kv_lanes, 0,
          "UCX workers (each with a progress thread) that send and receive KV messages; a "
          "transfer spreads its messages over min(sender's, receiver's) lanes, so that several "
          "cores copy at once over shared memory and tcp. 0: 2 for a KV cache on a GPU, else 1 "
          "(CPU cores compute there). 1 to 16 otherwise.");
ABSL_FLAG(bool, kv_peer_lane, true,
          "KV pool on a GPU: KV to decode workers on this host goes GPU to GPU over CUDA IPC "
          "(copy engines, NVLink where the GPUs have it), chosen per decode worker when it "
          "exports its pool; UCX to the others, and where the pool cannot be mapped. false: "
          "UCX only.");
ABSL_FLAG(int32_t, kv_receive_threads, 2,
          "Threads that copy received KV messages into the KV pool off UCX's progress thread, "
          "so that receiving one message overlaps copying the last. 0: copy on the progress "
          "thread.");
ABSL_FLAG(int32_t, kv_receive_fetches, 4,
          "KV messages per lane a GPU (or staged) KV cache fetches at once into its receive "
          "buffers; the rest wait their turn, so that fetches end one after another and the "
          "copy into the cache follows each.");
ABSL_FLAG(bool, kv_tier, true,
          "With --attention_services and --prefix_caching: the DRAM tier of the prefix cache. "
          "Cached KV blocks are written through to the first service with a block store "
          "(--kv_store_mb there), and a prompt whose prefix the store holds beyond this worker's "
          "cache fetches those blocks instead of computing them, when the measured fetch speed "
          "says that is faster.");
ABSL_FLAG(int32_t, kv_tier_min_fetch_blocks, 1,
          "With --kv_tier: fetch only when the store holds at least this many more blocks of the "
          "prompt than this worker's cache.");
ABSL_FLAG(bool, kv_tier_always_fetch, false,
          "With --kv_tier: fetch whatever the store holds, even when computing it looks faster "
          "(for tests and measurements).");
ABSL_FLAG(int32_t, kv_tier_fetch_threads, 2, "With --kv_tier: threads fetching blocks.");
ABSL_FLAG(double, testonly_dram_hit_value, -1,
          "For tests: >= 0 reports this to routers as what a prompt token held only in the DRAM "
          "tier is worth here (WorkerLoad.dram_hit_value), instead of what was measured.");
ABSL_FLAG(std::vector<std::string>, attention_services, {},
          "CPU attention services (host:port, comma-separated) that this decode worker moves "
          "long-context sequences to (NEO-style offload); empty: none.");
ABSL_FLAG(int32_t, offload_min_context_tokens, 2048,
          "With --attention_services: a decoding sequence whose context reaches this many tokens "
          "moves to a CPU attention service; 0: never for its length alone.");
ABSL_FLAG(double, offload_low_watermark, 0.05,
          "With --attention_services: while less than this share of the KV cache is free, or "
          "fewer blocks than the first waiting request needs to start, the longest resident "
          "sequences move to CPU attention services instead of being preempted or keeping it "
          "waiting; 0: never for lack of blocks.");
ABSL_FLAG(int32_t, offload_max_moves_per_step, 4,
          "Most sequences moved to attention services before one decode step.");
ABSL_FLAG(std::string, offload_pipeline, "auto",
          "With --attention_services: asymmetric pipelining of decode steps (a second "
          "sub-batch of CPU-resident sequences whose attention runs at the service while this "
          "worker computes the first). auto: each step as the cost tables measured at start-up "
          "say is fastest; always: every CPU-resident sequence in the second sub-batch; never.");
ABSL_FLAG(absl::Duration, role_change_announce, absl::Milliseconds(300),
          "On a role change, how long the worker keeps accepting the work it is about to lose "
          "while its load samples announce the change, so that routers (which learn roles from "
          "them every --load_interval_ms, 100ms by default) stop sending it first; part of the "
          "drain timeout.");
ABSL_FLAG(bool, offload_background_moves, true,
          "Copy a pool-pressure move's KV to the attention service in the background while the "
          "engine keeps stepping (the sequence moves once the copy is done); false: before the "
          "step, while every running sequence waits. Long-context moves are always copied "
          "before the step.");
ABSL_FLAG(int32_t, offload_move_threads, 2,
          "With --offload_background_moves: how many moves copy their KV at once, each on a "
          "thread of its own (more fill the CPU sooner when many sequences wait for blocks, and "
          "share the link and the service's appends).");
ABSL_FLAG(bool, offload_keep_throughput, false,
          "With --attention_services: move a sequence to a service only while the start-up "
          "cost tables (scaled by the service times observed since) say the decode step keeps "
          "its throughput with it (no slower per sequence, counting the waiting sequences that "
          "could follow it, which share its round trip); the rest wait for blocks as without "
          "offload.");
ABSL_FLAG(absl::Duration, offload_max_step_time, absl::ZeroDuration(),
          "With --attention_services: move a sequence to a service only while the start-up "
          "cost tables say the decode step (one token of every sequence) stays within this with "
          "it, and with a waiting sequence in its freed blocks: set it below the tightest TPOT "
          "target. 0: no limit (capacity first).");
ABSL_FLAG(int32_t, attention_lanes, 2,
          "With --attention_services: UCX lanes (each a UCX worker with its own progress thread) "
          "to each service, used up to the service's own --lanes; several lanes move more "
          "attention requests and DRAM-tier blocks at once.");
ABSL_FLAG(absl::Duration, attention_timeout, absl::Seconds(5),
          "How long a decode step waits for an attention service before its sequences come back "
          "here and are recomputed.");
ABSL_FLAG(int32_t, testonly_stall_kv_transfer_after_layers, -1,
          "Fault injection for tests: each KV transfer stops after this many layers until "
          "cancelled. -1: off.");
ABSL_FLAG(std::string, testonly_stall_kv_transfer_to, "",
          "With --testonly_stall_kv_transfer_after_layers: only transfers to the decode worker "
          "of this id stall; empty: every transfer.");
namespace trident::worker {
namespace {

absl::StatusOr<WorkerServerOptions> OptionsFromFlags() {
  WorkerServerOptions options;
  TRIDENT_ASSIGN_OR_RETURN(const Device device, ParseDevice(absl::GetFlag(FLAGS_device)));
  TRIDENT_ASSIGN_OR_RETURN(options.role, ParseRole(absl::GetFlag(FLAGS_role)));
  TRIDENT_ASSIGN_OR_RETURN(options.kv_transport,
                           ParseKvTransport(absl::GetFlag(FLAGS_kv_transport)));
  WorkerModelOptions& model = options.model;
  model.model_dir = absl::GetFlag(FLAGS_model);
  model.cuda_device = device.kind == Device::Kind::kCuda ? device.ordinal : -1;
  model.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  model.tensor_parallel = absl::GetFlag(FLAGS_tensor_parallel);
  model.generated_weights = absl::GetFlag(FLAGS_generated_weights);
  model.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  model.cuda_graph_max_batch = absl::GetFlag(FLAGS_cuda_graph_max_batch);
  model.cuda_graph_max_context = absl::GetFlag(FLAGS_cuda_graph_max_context);
  model.cuda_gemv = absl::GetFlag(FLAGS_cuda_gemv);
  model.cuda_gemv_bulk = absl::GetFlag(FLAGS_cuda_gemv_bulk);
  model.cuda_gemv_fusions = absl::GetFlag(FLAGS_cuda_gemv_fusions);
  model.cuda_gemv_dynamic = absl::GetFlag(FLAGS_cuda_gemv_dynamic);
  model.cuda_decode_stable_prefix = absl::GetFlag(FLAGS_cuda_decode_stable_prefix);
  model.cuda_gemm_skinny = absl::GetFlag(FLAGS_cuda_gemm_skinny);
  model.cuda_gemm_tune_algos = absl::GetFlag(FLAGS_cuda_gemm_tune_algos);
  model.cuda_pdl_chain = absl::GetFlag(FLAGS_cuda_pdl_chain);
  model.gpu_kv_cache_tokens = absl::GetFlag(FLAGS_gpu_kv_cache_tokens);
  model.model_name = absl::GetFlag(FLAGS_model_name);
  model.dtype = absl::GetFlag(FLAGS_dtype);
  model.bf16_activations = absl::GetFlag(FLAGS_bf16_activations);
  model.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mb) << 20;
  model.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
  model.kv_cache_dtype = absl::GetFlag(FLAGS_kv_cache_dtype);
  model.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
  model.pin_threads = absl::GetFlag(FLAGS_pin_threads);
  model.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  model.max_prefill_tokens_while_decoding = absl::GetFlag(FLAGS_max_prefill_tokens_while_decoding);
  model.max_prefill_tokens_when_backlogged =
      absl::GetFlag(FLAGS_max_prefill_tokens_when_backlogged);
  model.prefill_backlog_tokens = absl::GetFlag(FLAGS_prefill_backlog_tokens);
  model.max_running = absl::GetFlag(FLAGS_max_running);
  model.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  model.shared_prefix_wait_steps = absl::GetFlag(FLAGS_shared_prefix_wait_steps);
  model.max_model_len = absl::GetFlag(FLAGS_max_model_len);
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.advertise_address = absl::GetFlag(FLAGS_advertise_address);
  options.ucx_transports = absl::GetFlag(FLAGS_ucx_transports);
  options.kv_staging_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_kv_staging_mb)) << 20;
  options.kv_lanes = absl::GetFlag(FLAGS_kv_lanes);
  options.kv_peer_lane = absl::GetFlag(FLAGS_kv_peer_lane);
  options.kv_receive_threads = absl::GetFlag(FLAGS_kv_receive_threads);
  options.kv_receive_fetches = absl::GetFlag(FLAGS_kv_receive_fetches);
  options.testonly_stall_kv_transfer_after_layers =
      absl::GetFlag(FLAGS_testonly_stall_kv_transfer_after_layers);
  options.testonly_stall_kv_transfer_to = absl::GetFlag(FLAGS_testonly_stall_kv_transfer_to);
  options.attention_services = absl::GetFlag(FLAGS_attention_services);
  options.kv_tier = absl::GetFlag(FLAGS_kv_tier);
  options.kv_tier_options.min_fetch_blocks = absl::GetFlag(FLAGS_kv_tier_min_fetch_blocks);
  options.kv_tier_options.always_fetch = absl::GetFlag(FLAGS_kv_tier_always_fetch);
  options.kv_tier_options.testonly_dram_hit_value = absl::GetFlag(FLAGS_testonly_dram_hit_value);
  options.kv_tier_options.fetch_threads = absl::GetFlag(FLAGS_kv_tier_fetch_threads);
  options.offload_policy.min_context_tokens = absl::GetFlag(FLAGS_offload_min_context_tokens);
  options.offload_policy.low_watermark = absl::GetFlag(FLAGS_offload_low_watermark);
  options.offload_policy.max_moves = absl::GetFlag(FLAGS_offload_max_moves_per_step);
  options.attention_timeout = absl::GetFlag(FLAGS_attention_timeout);
  options.attention_lanes = absl::GetFlag(FLAGS_attention_lanes);
  options.offload_pipeline = absl::GetFlag(FLAGS_offload_pipeline);
  options.offload_keep_throughput = absl::GetFlag(FLAGS_offload_keep_throughput);
  options.offload_background_moves = absl::GetFlag(FLAGS_offload_background_moves);
  options.offload_move_threads = absl::GetFlag(FLAGS_offload_move_threads);
  options.offload_max_step_time = absl::GetFlag(FLAGS_offload_max_step_time);
  options.role_change_announce = absl::GetFlag(FLAGS_role_change_announce);
  options.controller_address = absl::GetFlag(FLAGS_controller_address);
  return options;
}

}  // namespace
}  // namespace trident::worker

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "worker", .grpc_port = 50052, .metrics_port = 9402},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        TRIDENT_ASSIGN_OR_RETURN(trident::worker::WorkerServerOptions options,
                                 trident::worker::OptionsFromFlags());
        TRIDENT_ASSIGN_OR_RETURN(
            std::unique_ptr<trident::worker::WorkerServer> server,
            trident::worker::WorkerServer::Create(std::move(options), &runtime.registry()));
        trident::ServeHooks hooks;
        hooks.on_serving = [&server](const trident::ServingPorts& ports) {
          const absl::Status joined =
              server->JoinController(trident::controller_client::AdvertisedAddresses(
                  absl::GetFlag(FLAGS_advertise_address), ports.host, ports.grpc_port,
                  ports.metrics_port));
          if (!joined.ok()) TRIDENT_LOG(ERROR) << "not joining the controller: " << joined;
        };
        hooks.on_drain = [&server] { server->LeaveController(); };
        return runtime.Serve(server->services(), hooks);
      });
}
