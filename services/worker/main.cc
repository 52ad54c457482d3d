// A worker: one model replica on one device, in role prefill, decode or both.

#include <unistd.h>

#include <algorithm>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging/log.h"
#include "common/service/service_runtime.h"
#include "common/status/error_details.h"
#include "common/time/clock.h"
#include "common/transport/ucx_worker.h"
#include "services/worker/decode_service.h"
#include "services/worker/generation_service.h"
#include "services/worker/prefill_service.h"
#include "common/transport/kv/transfer_metrics.h"
#include "common/transport/kv/ucx_kv.h"
#include "services/worker/kv_handoff/engine_block_source.h"
#include "services/worker/kv_handoff/kv_reservations.h"
#include "services/worker/worker_model.h"
#include "services/worker/worker_services.h"

ABSL_FLAG(std::string, device, "cpu", "Where the model runs: 'cpu' or 'cuda:N'.");
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
          "(the KV cache gets what the rest leaves).");
ABSL_FLAG(bool, cuda_graphs, true,
          "CUDA backend: replay decode steps from CUDA graphs captured per batch-size bucket "
          "(false: launch every kernel every step).");
ABSL_FLAG(int32_t, kv_block_size, 16, "Tokens per KV cache block.");
ABSL_FLAG(int32_t, cpu_threads, 0,
          "Threads for the CPU backend; 0: one per physical core the process may use.");
ABSL_FLAG(bool, pin_threads, true, "Pin each CPU backend thread to one core.");
ABSL_FLAG(int32_t, max_batch_tokens, 2048,
          "Token budget of one forward pass (prefill chunks plus decode tokens).");
ABSL_FLAG(int32_t, max_running, 256, "Most sequences in the running batch.");
ABSL_FLAG(int32_t, max_model_len, 0,
          "Context window cap in tokens; 0: the model's max_position_embeddings.");
ABSL_FLAG(std::string, worker_id, "",
          "Id this worker reports in load samples and KV endpoints; empty: worker-<pid>.");
ABSL_FLAG(std::string, advertise_address, "",
          "host:port peers use to reach this worker (KvDestination.decode_address); empty: "
          "peers use the address they know it by.");
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
ABSL_FLAG(int32_t, kv_receive_threads, 2,
          "Threads that copy received KV messages into the KV pool off UCX's progress thread, "
          "so that receiving one message overlaps copying the last. 0: copy on the progress "
          "thread.");
ABSL_FLAG(int32_t, kv_receive_fetches, 4,
          "KV messages per lane a GPU (or staged) KV cache fetches at once into its receive "
          "buffers; the rest wait their turn, so that fetches end one after another and the "
          "copy into the cache follows each.");
ABSL_FLAG(int32_t, testonly_stall_kv_transfer_after_layers, -1,
          "Fault injection for tests: each KV transfer stops after this many layers until "
          "cancelled. -1: off.");
ABSL_FLAG(std::string, controller_address, "",
          "host:port of the controller to register with; empty: run standalone.");

int main(int argc, char** argv) {
  return trident::RunServiceMain(
      argc, argv, {.component = "worker", .grpc_port = 50052, .metrics_port = 9402},
      [](trident::ServiceRuntime& runtime) -> absl::Status {
        absl::StatusOr<trident::worker::Device> device =
            trident::worker::ParseDevice(absl::GetFlag(FLAGS_device));
        if (!device.ok()) return device.status();
        absl::StatusOr<trident::v1::Role> role =
            trident::worker::ParseRole(absl::GetFlag(FLAGS_role));
        if (!role.ok()) return role.status();
        TRIDENT_LOG(INFO) << "worker on " << device->ToString() << ", role "
                          << trident::v1::Role_Name(*role);
        std::vector<trident::RegisteredService> services;
        std::unique_ptr<trident::worker::WorkerModel> model;
        trident::RealClock clock;
        if (!absl::GetFlag(FLAGS_model).empty()) {
          trident::worker::WorkerModelOptions options;
          options.model_dir = absl::GetFlag(FLAGS_model);
          if (device->kind == trident::worker::Device::Kind::kCuda) {
            options.cuda_device = device->ordinal;
          }
          options.gpu_memory_fraction = absl::GetFlag(FLAGS_gpu_memory_fraction);
          options.cuda_graphs = absl::GetFlag(FLAGS_cuda_graphs);
          options.model_name = absl::GetFlag(FLAGS_model_name);
          options.dtype = absl::GetFlag(FLAGS_dtype);
          options.bf16_activations = absl::GetFlag(FLAGS_bf16_activations);
          options.kv_cache_bytes = absl::GetFlag(FLAGS_kv_cache_mb) << 20;
          options.kv_block_size = absl::GetFlag(FLAGS_kv_block_size);
          options.cpu_threads = absl::GetFlag(FLAGS_cpu_threads);
          options.pin_threads = absl::GetFlag(FLAGS_pin_threads);
          options.max_batch_tokens = absl::GetFlag(FLAGS_max_batch_tokens);
          options.max_running = absl::GetFlag(FLAGS_max_running);
          options.max_model_len = absl::GetFlag(FLAGS_max_model_len);
          absl::StatusOr<std::unique_ptr<trident::worker::WorkerModel>> loaded =
              trident::worker::LoadWorkerModel(options, &runtime.registry());
          if (!loaded.ok()) return loaded.status();
          model = std::move(*loaded);
        } else {
          TRIDENT_LOG(WARNING) << "no --model given: this worker serves no generations";
        }
        // Load reports: engine figures, this process's identity and role.
        trident::worker::WorkerIdentity identity;
        identity.worker_id = absl::GetFlag(FLAGS_worker_id).empty()
                                 ? absl::StrCat("worker-", getpid())
                                 : absl::GetFlag(FLAGS_worker_id);
        identity.incarnation = absl::Uniform<uint64_t>(absl::BitGen()) | 1;
        identity.role = *role;
        // Decode (KV reservations, the decode stream) and Prefill. Without a
        // KV transport, ReserveKv and Prefill with a destination answer
        // FAILED_PRECONDITION; Decode without a reservation serves role
        // `both`, Prefill without a destination computes and discards.
        // The KV transport: registers the backend's KV pool with UCX.
        // KV reservations, on the engine's blocks: the Decode service serves
        // them, the KV transport writes received KV messages into them.
        std::unique_ptr<trident::worker::EngineBlockSource> blocks;
        std::unique_ptr<trident::worker::KvReservations> reservations;
        if (model != nullptr) {
          blocks = std::make_unique<trident::worker::EngineBlockSource>(model->engine.get());
          trident::worker::KvReservationOptions reservation_options;
          reservation_options.block_size = absl::GetFlag(FLAGS_kv_block_size);
          reservations = std::make_unique<trident::worker::KvReservations>(
              blocks.get(), &clock, reservation_options);
        }
        std::unique_ptr<trident::transport::UcxWorker> ucx;
        std::unique_ptr<trident::transport::UcxKv> ucx_kv;
        std::string kv_transport = absl::GetFlag(FLAGS_kv_transport);
        if (kv_transport != "ucx" && kv_transport != "none" && kv_transport != "auto") {
          return trident::InvalidArgumentForField(
              "--kv_transport",
              absl::StrCat("expected 'ucx', 'none' or 'auto', got '", kv_transport, "'"));
        }
        if (kv_transport == "auto") {
          kv_transport = *role == trident::v1::ROLE_BOTH ? "none" : "ucx";
        }
        if (model != nullptr && kv_transport == "ucx") {
          trident::transport::UcxOptions ucx_options;
          ucx_options.transports = absl::GetFlag(FLAGS_ucx_transports);
          ucx_options.name = identity.worker_id;
          absl::StatusOr<std::unique_ptr<trident::transport::UcxWorker>> created =
              trident::transport::UcxWorker::Create(ucx_options);
          if (!created.ok()) return created.status();
          ucx = std::move(*created);
          absl::StatusOr<trident::backend::KvMemory> memory = model->engine->backend().kv_memory();
          if (!memory.ok()) return memory.status();
          trident::transport::UcxKvOptions kv_options;
          kv_options.sink = reservations.get();
          kv_options.receive_threads = absl::GetFlag(FLAGS_kv_receive_threads);
          kv_options.receive_fetches = absl::GetFlag(FLAGS_kv_receive_fetches);
          const int32_t lanes = absl::GetFlag(FLAGS_kv_lanes);
          kv_options.lanes = lanes != 0 ? lanes : (memory->device ? 2 : 1);
          const int num_lanes = kv_options.lanes;
          if (memory->device) {
            // Stages the pool when UCX cannot register it, and copies KV
            // messages (tcp, shared memory) into it either way.
            absl::StatusOr<std::unique_ptr<trident::backend::KvCopier>> copier =
                model->engine->backend().CreateKvCopier();
            if (!copier.ok()) return copier.status();
            kv_options.copier = std::move(*copier);
            kv_options.staging_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_kv_staging_mb))
                                       << 20;
            kv_options.staging_slot_bytes =
                std::min<uint64_t>(kv_options.staging_slot_bytes, kv_options.staging_bytes);
          }
          absl::StatusOr<std::unique_ptr<trident::transport::UcxKv>> kv =
              trident::transport::UcxKv::Create(ucx.get(), *memory, identity.worker_id,
                                             identity.incarnation, std::move(kv_options));
          if (!kv.ok()) return kv.status();
          ucx_kv = std::move(*kv);
          TRIDENT_LOG(INFO) << "KV transport: UCX"
                            << (ucx_options.transports.empty()
                                    ? std::string()
                                    : absl::StrCat(" over ", ucx_options.transports))
                            << ", " << memory->bytes / (1 << 20) << " MiB of KV "
                            << (ucx_kv->staged()
                                    ? absl::StrCat("in device memory, staged through ",
                                                   absl::GetFlag(FLAGS_kv_staging_mb),
                                                   " MiB of pinned host memory (UCX has no "
                                                   "CUDA support)")
                                    : std::string("registered"))
                            << ", " << num_lanes << " message lane" << (num_lanes == 1 ? "" : "s");
        }
        // KV-transfer metrics: the prefill side sends through a metered sender.
        trident::transport::KvTransferMetrics kv_metrics(runtime.registry());
        std::unique_ptr<trident::transport::MeteredKvSender> metered_kv;
        if (ucx_kv != nullptr) {
          metered_kv =
              std::make_unique<trident::transport::MeteredKvSender>(ucx_kv.get(), &kv_metrics, &clock);
        }
        // The role, shared by every service below and changed by SetRole.
        trident::worker::WorkerRoleOptions role_options;
        role_options.has_kv_transport = model == nullptr || ucx_kv != nullptr;
        role_options.registry = &runtime.registry();
        trident::worker::WorkerRole worker_role(*role, &clock, role_options);
        // The public Generation API, served in role `both` (Generate answers
        // FAILED_PRECONDITION in the other roles).
        std::unique_ptr<trident::worker::GenerationService> generation;
        if (model != nullptr) {
          generation = std::make_unique<trident::worker::GenerationService>(
              model->engine.get(), model->tokenizer.get(), model->info, &clock, &worker_role);
          services.push_back({generation.get(), trident::v1::Generation::service_full_name()});
        }
        trident::worker::UnservedPrefillService unserved_prefill;
        std::unique_ptr<trident::worker::PrefillService> prefill;
        trident::worker::UnservedDecodeService unserved_decode;
        std::unique_ptr<trident::worker::DecodeService> decode;
        if (model != nullptr) {
          trident::worker::DecodeServiceOptions decode_options;
          decode_options.worker_id = identity.worker_id;
          decode_options.incarnation = identity.incarnation;
          decode_options.address = absl::GetFlag(FLAGS_advertise_address);
          decode_options.worker_role = &worker_role;
          decode = std::make_unique<trident::worker::DecodeService>(
              model->engine.get(), model->info, reservations.get(), ucx_kv.get(), &clock,
              decode_options);
          services.push_back({decode.get(), trident::v1::Decode::service_full_name()});
          trident::worker::PrefillServiceOptions prefill_options;
          prefill_options.worker_id = identity.worker_id;
          prefill_options.worker_role = &worker_role;
          prefill_options.testonly_stall_after_layers =
              absl::GetFlag(FLAGS_testonly_stall_kv_transfer_after_layers);
          prefill = std::make_unique<trident::worker::PrefillService>(
              model->engine.get(), model->info, metered_kv.get(), &clock, prefill_options);
          services.push_back({prefill.get(), trident::v1::Prefill::service_full_name()});
        } else {
          services.push_back({&unserved_decode, trident::v1::Decode::service_full_name()});
          services.push_back({&unserved_prefill, trident::v1::Prefill::service_full_name()});
        }
        std::unique_ptr<trident::worker::LoadStreams> loads;
        std::unique_ptr<trident::transport::PeriodicSampler> kv_sampler;
        if (model != nullptr) {
          trident::engine::Engine* engine = model->engine.get();
          const trident::worker::KvReservations* held = reservations.get();
          const trident::worker::WorkerRole* current_role = &worker_role;
          loads = std::make_unique<trident::worker::LoadStreams>(
              [identity, engine, reservations = held, current_role] {
                trident::worker::WorkerIdentity now = identity;
                const trident::worker::WorkerRole::State state = current_role->state();
                now.role = state.role;
                now.pending_role = state.pending_role;
                return trident::worker::WorkerLoadFromStats(
                    now, engine->stats(), reservations->blocks_held(),
                    reservations->num_reservations(), absl::Now());
              });
          kv_sampler = std::make_unique<trident::transport::PeriodicSampler>(
              absl::Milliseconds(250), [reservations = held, &kv_metrics, kv = ucx_kv.get()] {
                kv_metrics.SetReservations(reservations->num_reservations(),
                                           reservations->blocks_held());
                if (kv != nullptr) kv_metrics.SetDroppedMessages(kv->dropped_messages());
              });
        }
        trident::worker::WorkerControlService control(
            model != nullptr ? model->engine.get() : nullptr, loads.get(), &worker_role);
        services.push_back({&control, trident::v1::WorkerControl::service_full_name()});
        absl::Status served = runtime.Serve(std::move(services));
        if (model != nullptr) model->engine->Shutdown();
        return served;
      });
}
