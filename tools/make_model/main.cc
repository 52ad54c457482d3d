// make_model: writes a deterministic random-weight model directory.
//
//   make_model --preset=llama3-tiny --out_dir=/tmp/model [--dtype=bf16] [--seed=N]
//       [--weights=false]

#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_join.h"
#include "common/logging/log.h"
#include "common/model/generate/model_gen.h"

ABSL_FLAG(std::string, preset, "llama3-tiny",
          "Model shape: llama3-tiny, qwen2-tiny, mistral-tiny, llama-100m, llama3-8b or "
          "llama3-70b (141 GB).");
ABSL_FLAG(std::string, out_dir, "", "Directory to write (created if missing). Required.");
ABSL_FLAG(std::string, dtype, "", "Weight format: f32 or bf16 (default: the preset's).");
ABSL_FLAG(int64_t, seed, -1, "Weight seed (default: the preset's).");
ABSL_FLAG(bool, weights, true,
          "Write the weights. false: config, tokenizer and generated_weights.json only; a "
          "worker started with --generated_weights computes the same weights in memory (a "
          "llama3-70b serving benchmark without 141 GB on disk).");
ABSL_FLAG(int64_t, max_shard_mb, -1,
          "Shard the weights into files of at most this many MiB with an index "
          "(0: one file; default: the preset's).");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("Writes a random-weight Llama-family model in Hugging Face layout.");
  absl::ParseCommandLine(argc, argv);
  trident::log::InitLoggingFromFlags();
  if (absl::GetFlag(FLAGS_out_dir).empty()) {
    std::fprintf(stderr, "make_model: --out_dir is required\n");
    return 2;
  }
  auto spec = trident::model::generate::PresetSpec(absl::GetFlag(FLAGS_preset));
  if (!spec.ok()) {
    std::fprintf(stderr, "make_model: %s\n", std::string(spec.status().message()).c_str());
    return 2;
  }
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  if (dtype == "f32") {
    spec->dtype = trident::numeric::DType::kF32;
  } else if (dtype == "bf16") {
    spec->dtype = trident::numeric::DType::kBF16;
  } else if (!dtype.empty()) {
    std::fprintf(stderr, "make_model: --dtype must be f32 or bf16, got \"%s\"\n", dtype.c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_seed) >= 0) spec->seed = static_cast<uint64_t>(absl::GetFlag(FLAGS_seed));
  if (absl::GetFlag(FLAGS_max_shard_mb) >= 0) {
    spec->max_shard_bytes = static_cast<uint64_t>(absl::GetFlag(FLAGS_max_shard_mb)) << 20;
  }
  spec->write_weights = absl::GetFlag(FLAGS_weights);
  absl::Status status = trident::model::generate::WriteModel(*spec, absl::GetFlag(FLAGS_out_dir));
  if (!status.ok()) {
    std::fprintf(stderr, "make_model: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s to %s\n", spec->preset.c_str(), absl::GetFlag(FLAGS_out_dir).c_str());
  return 0;
}
