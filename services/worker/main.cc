// A worker: one model replica on one device, in role prefill, decode or both.

#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/logging/log.h"
#include "common/service/service_runtime.h"
#include "services/worker/worker_services.h"

ABSL_FLAG(std::string, device, "cpu", "Where the model runs: 'cpu' or 'cuda:N'.");
ABSL_FLAG(std::string, role, "both",
          "Initial role: 'prefill', 'decode' or 'both' (colocated). The controller may change "
          "it at run time.");
ABSL_FLAG(std::string, model, "",
          "Directory of a Hugging Face Llama-family model (config.json, *.safetensors, "
          "tokenizer.json).");
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
        if (device->kind == trident::worker::Device::Kind::kCuda) {
          return absl::FailedPreconditionError(
              absl::StrCat("--device=", device->ToString(),
                           ": this worker build has no CUDA backend; use --device=cpu"));
        }
        TRIDENT_LOG(INFO) << "worker on " << device->ToString() << ", role "
                          << trident::v1::Role_Name(*role);
        trident::worker::PrefillService prefill;
        trident::worker::DecodeService decode;
        trident::worker::WorkerControlService control;
        return runtime.Serve({{&prefill, trident::v1::Prefill::service_full_name()},
                              {&decode, trident::v1::Decode::service_full_name()},
                              {&control, trident::v1::WorkerControl::service_full_name()}});
      });
}
