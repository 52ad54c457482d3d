// End-to-end generation on the CUDA backend through the engine, the shape of
// Hugging Face's `generate()` benchmark (bench/peers/hf_generate_peer.py):
// `batch` requests of `prompt_len` random tokens, greedy, exactly
// `new_tokens` generated each, all submitted at once. Per batch size it
// prints generated tokens/s over the whole run (prefill included, as the
// peer counts), decode-only tokens/s, mean decode step time and TTFT; for
// batch 1, the fraction of the weight-bandwidth roofline (weight bytes read
// per decode step over a read ceiling measured in the same run). `backend
// step ms` times ForwardSample alone on a synthetic decode batch of the same
// size (no engine), to split a step between backend and engine. Given the
// peer's JSON lines (--peer_json), it prints the ratio to the peer.
//
//   cuda_engine_benchmark --model_dir=DIR --batch=1,16,64 --prompt_len=512
//       --new_tokens=128 [--peer_json=FILE]
//
// One warm-up round per batch size (captures the decode graphs), then one
// timed round.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/backend/cuda/cuda_backend.h"
#include "common/engine/engine_core.h"
#include "common/kv/paged_block_allocator.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#include "common/status/status_macros.h"
#include "kernels/cuda/testing/kernel_profile.h"
#include "kernels/cuda/testing/kernel_trace.h"
#include "kernels/cuda/testing/read_ceiling.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, "", "Model directory (e.g. make_model --preset=llama3-8b).");
ABSL_FLAG(std::string, preset, "",
          "Instead of --model_dir: a make_model preset's random weights, computed in memory "
          "(model/generate's RandomWeights) rather than read from disk.");
ABSL_FLAG(std::string, batch, "1,16,64", "Comma-separated batch sizes.");
ABSL_FLAG(int32_t, prompt_len, 512, "Prompt tokens per request.");
ABSL_FLAG(int32_t, new_tokens, 128, "Generated tokens per request.");
ABSL_FLAG(int32_t, max_batch_tokens, 8192, "Engine token budget per step.");
ABSL_FLAG(double, gpu_memory_fraction, 0.9, "Device memory share for the backend.");
ABSL_FLAG(bool, cuda_graphs, true, "Replay decode steps from CUDA graphs.");
ABSL_FLAG(bool, gemv, true,
          "Single-row projections take the GEMV kernel (false: cuBLASLt for all).");
ABSL_FLAG(int32_t, decode_variant, -1,
          "Decode attention kernel variant (kernels/cuda/paged_decode_attention; -1: the "
          "backend's default).");
ABSL_FLAG(bool, decode_stable_prefix, true,
          "Decode attention copies the cached positions before the step's token ahead of its "
          "wait on the q/k/v projection (CudaBackendOptions::decode_stable_prefix).");
ABSL_FLAG(bool, gemv_dynamic, true,
          "Hopper's GEMV hands its items to CTAs as they ask (CudaBackendOptions::gemv_dynamic).");
ABSL_FLAG(bool, gemv_bulk, true,
          "On sm_90 those projections take Hopper's bulk-copy GEMV (false: the "
          "register-streaming GEMV; CudaBackendOptions::gemv_bulk).");
ABSL_FLAG(bool, gemv_norm, true,
          "Hopper's GEMV takes the RMSNorm ahead of single-row projections itself "
          "(CudaBackendOptions::gemv_norm).");
ABSL_FLAG(bool, gemv_rope, true,
          "Hopper's GEMV rotates a single token's q and k in its q/k/v projection's epilogue "
          "(CudaBackendOptions::gemv_rope).");
ABSL_FLAG(bool, gemm_skinny, false,
          "On sm_90 projections of 2-64 rows take Hopper's skinny GEMM instead of cuBLASLt "
          "(CudaBackendOptions::gemm_skinny).");
ABSL_FLAG(bool, gemm_skinny_cluster, false,
          "With --gemm_skinny, projections whose tiles fit one wave as clusters split each "
          "tile's k within a cluster (CudaBackendOptions::gemm_skinny_cluster).");
ABSL_FLAG(int64_t, gemm_skinny_silu_max_rows, 64,
          "Without --gemm_skinny, the fused gate/up + SwiGLU of up to this many rows still takes "
          "the skinny GEMM (0: cuBLASLt and the activation kernel; "
          "CudaBackendOptions::gemm_skinny_silu_max_rows).");
ABSL_FLAG(int32_t, gemm_tune_algos, 16,
          "cuBLASLt candidates timed per decode-graph shape at capture "
          "(CudaBackendOptions::gemm_tune_algos; 0: the heuristic's first choice).");
ABSL_FLAG(bool, pdl, true, "Launch the GEMV kernels with programmatic dependent launch.");
ABSL_FLAG(bool, pdl_chain, true,
          "Launch the norms, RoPE, the KV append, SwiGLU and decode attention with programmatic "
          "dependent launch too (CudaBackendOptions::pdl_chain).");
ABSL_FLAG(bool, kv_fp8, false, "FP8 E4M3 KV cache (CudaBackendOptions::kv_cache_dtype).");
ABSL_FLAG(std::string, peer_json, "",
          "Output of bench/peers/hf_generate_peer.py for the same shapes (JSON lines).");
ABSL_FLAG(uint32_t, seed, 0, "Seed of the random prompts.");
ABSL_FLAG(int32_t, trace_steps, 0,
          "After each batch's row, trace this many more of the probe's decode steps (CUPTI's "
          "kernel records) and print where their device time goes, per kernel and per position "
          "in a layer (0: no trace).");
ABSL_FLAG(std::string, mixed_chunks, "",
          "Comma-separated prompt chunk sizes: after the batch table, time each batch's decode "
          "step with one prompt chunk of each size beside it (a mixed step, as chunked prefill "
          "runs in a serving decode batch) against the decode step and the chunk alone; empty: "
          "no mixed table. A chunk must fit --prompt_len + --new_tokens.");
ABSL_FLAG(int32_t, tensor_parallel, 1,
          "Split the model over this many GPUs (CudaBackendOptions::tensor_parallel); the "
          "roofline and floors are per rank.");

namespace trident::backend {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// GB/s of a read-only kernel over `bytes` of device memory.
double MeasureReadCeiling(size_t bytes) {
  void* data = nullptr;
  unsigned* sink = nullptr;
  if (cudaMalloc(&data, bytes) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&sink), 4) != cudaSuccess)
    return 0;
  cudaMemset(data, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  kernels::cuda::LaunchReadCeiling(data, bytes, sink, nullptr);
  constexpr int kReps = 10;
  cudaEventRecord(start);
  for (int i = 0; i < kReps; ++i) kernels::cuda::LaunchReadCeiling(data, bytes, sink, nullptr);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaFree(data);
  cudaFree(sink);
  return static_cast<double>(bytes) * kReps / (ms * 1e-3) / 1e9;
}

// Bytes of weights one decode step reads on one rank of `tp` (`c` is the
// rank's config): every layer's matrices and the rank's block of the head
// (the embedding contributes one row per token).
double DecodeWeightBytes(const model::ModelConfig& c, int32_t tp) {
  const double h = c.hidden_size;
  const double q = static_cast<double>(c.num_attention_heads) * c.head_dim;
  const double kv = static_cast<double>(c.num_key_value_heads) * c.head_dim;
  const double layer = h * (q + 2 * kv) + q * h + 3 * h * c.intermediate_size;
  return 2.0 * (c.num_hidden_layers * layer + static_cast<double>(c.vocab_size) * h / tp);
}

// Bytes of KV one decode step reads on one rank per sequence at `context`.
double DecodeKvBytes(const model::ModelConfig& c, int32_t context, bool fp8) {
  return static_cast<double>(context) * c.num_hidden_layers * c.num_key_value_heads * c.head_dim *
         2 * (fp8 ? 1.0 : 2.0);
}

struct Round {
  double seconds = 0;         // submit to last token
  double decode_seconds = 0;  // steps after every request had its first token
  int64_t decode_steps = 0;
  int64_t generated = 0;
  double mean_ttft = 0;
  double prefill_seconds = 0;  // submit to every request's first token
};

absl::StatusOr<Round> RunRound(CudaBackend& backend, int32_t batch, int32_t prompt_len,
                               int32_t new_tokens, uint32_t seed) {
  kv::PagedBlockAllocator allocator(backend.kv_capacity().num_blocks);
  engine::EngineOptions options;
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_running = std::max(batch, 1);
  engine::EngineCore core(&backend, &allocator, options);
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(0, std::min(backend.vocab_size(), 1000) - 1);
  for (int32_t i = 0; i < batch; ++i) {
    engine::EngineRequest r;
    r.id = std::to_string(i);
    r.prompt.resize(prompt_len);
    for (int32_t& t : r.prompt) t = token(rng);
    r.max_tokens = new_tokens;
    r.sampling.temperature = 0;
    if (absl::Status s = core.Add(r); !s.ok()) return s;
  }
  Round round;
  const Clock::time_point start = Clock::now();
  Clock::time_point decode_start{};
  int32_t with_first = 0;
  double ttft_sum = 0;
  while (core.HasWork()) {
    const bool all_started = with_first == batch;
    auto events = core.Step();
    if (!events.ok()) return events.status();
    if (all_started) ++round.decode_steps;
    for (const engine::TokenEvent& ev : *events) {
      if (ev.finish == engine::FinishReason::kError) {
        return absl::InternalError(absl::StrCat("request ", ev.request_id, " failed"));
      }
      ++round.generated;
      if (ev.output_index == 0) {
        ++with_first;
        ttft_sum += Seconds(start, Clock::now());
      }
    }
    if (!all_started && with_first == batch) decode_start = Clock::now();
  }
  const Clock::time_point end = Clock::now();
  round.seconds = Seconds(start, end);
  round.decode_seconds = Seconds(decode_start, end);
  round.prefill_seconds = Seconds(start, decode_start);
  round.mean_ttft = ttft_sum / batch;
  return round;
}

// Where the device time of `steps` calls of step() goes (each call ends
// with its work done), in a model of `layers` layers.
template <typename Step>
absl::StatusOr<kernels::cuda::testing::StepProfile> TraceSteps(int32_t steps, int32_t layers,
                                                               Step step) {
  auto trace = kernels::cuda::testing::KernelTrace::Start();
  if (!trace.ok()) return trace.status();
  std::vector<uint64_t> boundaries = {(*trace)->Now()};
  for (int32_t i = 0; i < steps; ++i) {
    if (absl::Status s = step(); !s.ok()) return s;
    boundaries.push_back((*trace)->Now());
  }
  auto records = (*trace)->Stop();
  if (!records.ok()) return records.status();
  return kernels::cuda::testing::ProfileSteps(*std::move(records), boundaries, layers);
}

// Milliseconds per ForwardSample of `batch` one-token decode sequences at
// context `context` beside one sequence's prompt chunk of `chunk` tokens
// (from position 0; none when 0), greedy, without the engine: the backend's
// share of a decode step (chunk 0), a mixed step, or a prefill-only one
// (batch 0). With `trace_steps`, `trace` gets the profile of that many more
// steps.
absl::StatusOr<double> BackendStepMs(CudaBackend& backend, int32_t batch, int32_t context,
                                     int32_t chunk, int32_t trace_steps, std::string* trace) {
  const int32_t bs = backend.kv_capacity().block_size;
  const int32_t blocks_per_seq = (context + bs - 1) / bs;
  const int32_t chunk_blocks = (chunk + bs - 1) / bs;
  if (int64_t{blocks_per_seq} * batch + chunk_blocks > backend.kv_capacity().num_blocks) {
    return absl::ResourceExhaustedError("KV cache too small for the probe");
  }
  const int32_t num_seqs = batch + (chunk > 0 ? 1 : 0);
  std::vector<std::vector<int32_t>> tables(num_seqs);
  const std::vector<int32_t> token = {1};
  std::vector<int32_t> prompt(chunk);
  for (int32_t i = 0; i < chunk; ++i) prompt[i] = 1 + i % 1000;
  std::vector<StepSequence> seqs(num_seqs);
  sampling::SamplingParams greedy;
  greedy.temperature = 0;
  sampling::PenaltyState no_penalties;
  std::vector<RowSampling> rows(num_seqs, RowSampling{&greedy, &no_penalties, 0});
  std::vector<sampling::SampledToken> out(num_seqs);
  for (int32_t i = 0; i < num_seqs; ++i) {
    const bool prefill = i == batch;
    const int32_t first = i * blocks_per_seq;
    for (int32_t b = 0; b < (prefill ? chunk_blocks : blocks_per_seq); ++b) {
      tables[i].push_back(first + b);
    }
    seqs[i].tokens = prefill ? absl::MakeConstSpan(prompt) : absl::MakeConstSpan(token);
    seqs[i].start_position = prefill ? 0 : context - 1;
    seqs[i].block_table = tables[i];
    seqs[i].want_logits = true;
  }
  constexpr int kSteps = 30;
  Clock::time_point start;
  for (int i = 0; i < kSteps + 3; ++i) {
    if (i == 3) start = Clock::now();  // after warm-up and graph capture
    if (absl::Status s = backend.ForwardSample(seqs, rows, absl::MakeSpan(out)); !s.ok()) return s;
  }
  const double ms = 1e3 * Seconds(start, Clock::now()) / kSteps;
  if (trace_steps > 0) {
    auto profile = TraceSteps(trace_steps, backend.config().num_hidden_layers, [&] {
      return backend.ForwardSample(seqs, rows, absl::MakeSpan(out));
    });
    if (!profile.ok()) return profile.status();
    *trace = kernels::cuda::testing::FormatStepProfile(*profile);
  }
  return ms;
}

// With --mixed_chunks: for each batch and chunk, the backend's decode-only,
// prefill-only and mixed steps (BackendStepMs), what the chunk added to the
// decode step against its prefill alone, and the mixed step's TFLOP/s: 2
// FLOPs a parameter of the layers for every token, of the rank's head for
// the rows that sample (attention not counted). Traces the mixed steps with
// --trace_steps.
absl::Status PrintMixedTable(CudaBackend& backend, const std::vector<int32_t>& batches,
                             int32_t context, double weight_bytes, int32_t tp) {
  const model::ModelConfig& c = backend.config();
  const double head_bytes = 2.0 * c.vocab_size * c.hidden_size / tp;
  std::vector<int32_t> chunks;
  for (absl::string_view c :
       absl::StrSplit(absl::GetFlag(FLAGS_mixed_chunks), ',', absl::SkipEmpty())) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(c, &v) || v <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("--mixed_chunks: bad size '", c, "'"));
    }
    chunks.push_back(v);
  }
  if (chunks.empty()) return absl::OkStatus();
  const int32_t trace_steps = absl::GetFlag(FLAGS_trace_steps);
  std::printf(
      "\nmixed steps, decode sequences at context %d beside one prompt chunk (backend only)\n\n"
      "| batch | chunk | decode-only ms | prefill-only ms | mixed ms | chunk's share ms | "
      "of its prefill alone | mixed TFLOP/s |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- |\n",
      context);
  // Each chunk alone, once: it does not depend on the batch beside it.
  std::string unused;
  std::map<int32_t, double> prefill_ms;
  for (int32_t chunk : chunks) {
    TRIDENT_ASSIGN_OR_RETURN(prefill_ms[chunk],
                             BackendStepMs(backend, 0, context, chunk, 0, &unused));
  }
  std::vector<std::string> traces;
  for (int32_t batch : batches) {
    TRIDENT_ASSIGN_OR_RETURN(const double decode,
                             BackendStepMs(backend, batch, context, 0, 0, &unused));
    for (int32_t chunk : chunks) {
      std::string trace;
      TRIDENT_ASSIGN_OR_RETURN(const double mixed,
                               BackendStepMs(backend, batch, context, chunk, trace_steps, &trace));
      const double prefill = prefill_ms[chunk];
      const double flops = (weight_bytes - head_bytes) * (batch + chunk) + head_bytes * (batch + 1);
      std::printf("| %d | %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.0f |\n", batch, chunk, decode,
                  prefill, mixed, mixed - decode, (mixed - decode) / prefill,
                  flops / (mixed * 1e-3) / 1e12);
      std::fflush(stdout);
      if (!trace.empty()) {
        traces.push_back(absl::StrCat("\nmixed, batch ", batch, " + chunk ", chunk, ": ", trace));
      }
    }
  }
  for (const std::string& t : traces) std::printf("%s", t.c_str());
  return absl::OkStatus();
}

// The backend over `model_dir`, or over `preset`'s generated weights.
absl::StatusOr<std::unique_ptr<CudaBackend>> Load(const std::string& model_dir,
                                                  const std::string& preset,
                                                  const CudaBackendOptions& options) {
  if (preset.empty()) return CudaBackend::Create(model_dir, options);
  absl::StatusOr<model::generate::ModelSpec> spec = model::generate::PresetSpec(preset);
  if (!spec.ok()) return spec.status();
  auto weights = model::generate::RandomWeights::Create(*spec);
  if (!weights.ok()) return weights.status();
  return CudaBackend::CreateFromWeights(**weights, (*weights)->config(), options);
}

// The backend's options from the flags, for `batches` of prompt_len +
// new_tokens tokens.
CudaBackendOptions OptionsFromFlags(const std::vector<int32_t>& batches, int32_t prompt_len,
                                    int32_t new_tokens) {
  CudaBackendOptions options;
  options.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
  options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
  options.max_batch_sequences = std::max(256, *std::max_element(batches.begin(), batches.end()));
  options.max_model_len = prompt_len + new_tokens;
  options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
  options.gemv = absl::GetFlag(FLAGS_gemv);
  options.gemv_bulk = absl::GetFlag(FLAGS_gemv_bulk);
  options.gemv_dynamic = absl::GetFlag(FLAGS_gemv_dynamic);
  options.gemv_norm = absl::GetFlag(FLAGS_gemv_norm);
  options.gemv_rope = absl::GetFlag(FLAGS_gemv_rope);
  options.gemm_skinny = absl::GetFlag(FLAGS_gemm_skinny);
  options.gemm_skinny_silu_max_rows = absl::GetFlag(FLAGS_gemm_skinny_silu_max_rows);
  options.gemm_tune_algos = absl::GetFlag(FLAGS_gemm_tune_algos);
  options.gemm_skinny_cluster = absl::GetFlag(FLAGS_gemm_skinny_cluster);
  options.decode_variant = absl::GetFlag(FLAGS_decode_variant);
  options.decode_stable_prefix = absl::GetFlag(FLAGS_decode_stable_prefix);
  options.pdl = absl::GetFlag(FLAGS_pdl);
  options.pdl_chain = absl::GetFlag(FLAGS_pdl_chain);
  if (absl::GetFlag(FLAGS_kv_fp8)) options.kv_cache_dtype = numeric::DType::kFP8E4M3;
  return options;
}

int Main() {
  const std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  const std::string preset = absl::GetFlag(FLAGS_preset);
  if (model_dir.empty() == preset.empty()) {
    std::fprintf(stderr, "give one of --model_dir and --preset\n");
    return 2;
  }
  std::vector<int32_t> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batch), ',')) {
    int32_t v = 0;
    if (!absl::SimpleAtoi(b, &v) || v <= 0) {
      std::fprintf(stderr, "--batch: bad size '%s'\n", std::string(b).c_str());
      return 2;
    }
    batches.push_back(v);
  }
  const int32_t prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int32_t new_tokens = absl::GetFlag(FLAGS_new_tokens);
  const uint32_t seed = absl::GetFlag(FLAGS_seed);
  std::map<int32_t, double> peer;
  if (const std::string path = absl::GetFlag(FLAGS_peer_json); !path.empty()) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("batch") && j.contains("tokens_per_s")) {
        peer[j["batch"].get<int32_t>()] = j["tokens_per_s"].get<double>();
      }
    }
  }

  CudaBackendOptions options = OptionsFromFlags(batches, prompt_len, new_tokens);
  const int32_t tp = absl::GetFlag(FLAGS_tensor_parallel);
  options.tensor_parallel = tp;
  const auto load_start = Clock::now();
  auto backend = Load(model_dir, preset, options);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  std::printf("model %s loaded in %.1f s: %s\n",
              preset.empty() ? model_dir.c_str() : preset.c_str(),
              Seconds(load_start, Clock::now()), (*backend)->Describe().c_str());
  const double weight_bytes = DecodeWeightBytes((*backend)->config(), tp);
  const double ceiling = MeasureReadCeiling(size_t{4} << 30);
  const double roofline = ceiling * 1e9 / weight_bytes;
  std::printf(
      "seed %u; TP %d; decode weight bytes per rank %.2f GB; read ceiling %.0f GB/s (4 GiB, "
      "same run); batch-1 roofline %.1f tokens/s\n",
      seed, tp, weight_bytes / 1e9, ceiling, roofline);
  std::printf(
      "\n| batch | prompt | new | tokens/s (all) | decode tokens/s | decode step ms | "
      "backend step ms | weights+KV floor ms | mean TTFT ms | prefill tokens/s | peer tokens/s | "
      "ours / peer | of "
      "roofline |\n"
      "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::vector<std::string> traces;
  for (int32_t batch : batches) {
    if (auto warm = RunRound(**backend, batch, prompt_len, new_tokens, seed + 1); !warm.ok()) {
      std::fprintf(stderr, "batch %d warm-up: %s\n", batch, warm.status().ToString().c_str());
      return 1;
    }
    auto round = RunRound(**backend, batch, prompt_len, new_tokens, seed);
    if (!round.ok()) {
      std::fprintf(stderr, "batch %d: %s\n", batch, round.status().ToString().c_str());
      return 1;
    }
    const double all = round->generated / round->seconds;
    const double decode_tps =
        round->decode_steps > 0 ? batch * round->decode_steps / round->decode_seconds : 0;
    const double step_ms =
        round->decode_steps > 0 ? 1e3 * round->decode_seconds / round->decode_steps : 0;
    std::string trace;
    auto backend_ms = BackendStepMs(**backend, batch, prompt_len + new_tokens / 2, 0,
                                    absl::GetFlag(FLAGS_trace_steps), &trace);
    if (!backend_ms.ok()) {
      std::fprintf(stderr, "batch %d probe: %s\n", batch, backend_ms.status().ToString().c_str());
      return 1;
    }
    std::string peer_cell = "-", ratio_cell = "-", roof_cell = "-";
    if (auto it = peer.find(batch); it != peer.end()) {
      peer_cell = absl::StrCat(it->second);
      ratio_cell = absl::StrFormat("%.2f", all / it->second);
    }
    if (batch == 1) roof_cell = absl::StrFormat("%.2f", decode_tps / roofline);
    // One rank's weights and its KV heads of every sequence at the probe's
    // context, read once at the ceiling.
    const double floor_ms =
        1e3 *
        (weight_bytes + batch * DecodeKvBytes((*backend)->config(), prompt_len + new_tokens / 2,
                                              absl::GetFlag(FLAGS_kv_fp8))) /
        (ceiling * 1e9);
    const double prefill_tps = static_cast<double>(batch) * prompt_len / round->prefill_seconds;
    std::printf(
        "| %d | %d | %d | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | %.0f | %s | %s | %s |\n", batch,
        prompt_len, new_tokens, all, decode_tps, step_ms, *backend_ms, floor_ms,
        1e3 * round->mean_ttft, prefill_tps, peer_cell.c_str(), ratio_cell.c_str(),
        roof_cell.c_str());
    if (!trace.empty()) traces.push_back(absl::StrCat("\nbatch ", batch, ": ", trace));
    std::fflush(stdout);
  }
  for (const std::string& t : traces) std::printf("%s", t.c_str());
  if (absl::Status s =
          PrintMixedTable(**backend, batches, prompt_len + new_tokens / 2, weight_bytes, tp);
      !s.ok()) {
    std::fprintf(stderr, "mixed steps: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace trident::backend

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trident::backend::Main();
}
