// How fast RandomWeights computes a preset's weights: the time to plan the
// preset (its tokenizer included) and the bytes per second of reading its
// largest tensors in bf16, whole and as one tensor-parallel rank's rows, on
// all of the machine's cores.
//
//   random_weights_benchmark [--preset=llama3-8b]

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"

ABSL_FLAG(std::string, preset, "llama3-8b", "A make_model preset.");

namespace trident::model::generate {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int Main() {
  auto spec = PresetSpec(absl::GetFlag(FLAGS_preset));
  if (!spec.ok()) {
    std::fprintf(stderr, "%s\n", spec.status().ToString().c_str());
    return 2;
  }
  Clock::time_point start = Clock::now();
  auto weights = RandomWeights::Create(*spec);
  if (!weights.ok()) {
    std::fprintf(stderr, "%s\n", weights.status().ToString().c_str());
    return 1;
  }
  std::printf("%s: planned in %.2f s; %.1f GB of weights; %u cores\n", spec->preset.c_str(),
              Since(start), (*weights)->total_bytes() / 1e9, std::thread::hardware_concurrency());
  for (const char* name : {"model.layers.0.mlp.gate_proj.weight",
                           "model.layers.0.self_attn.o_proj.weight", "model.embed_tokens.weight"}) {
    auto info = (*weights)->Info(name);
    if (!info.ok()) continue;
    std::vector<uint16_t> out(static_cast<size_t>(info->numel));
    start = Clock::now();
    if (absl::Status s = (*weights)->ReadBf16(name, absl::MakeSpan(out)); !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double whole = Since(start);
    const int64_t rows = info->shape[0] / 4;
    std::vector<uint16_t> part(static_cast<size_t>(rows * info->shape[1]));
    start = Clock::now();
    if (absl::Status s = (*weights)->ReadBf16Slice(name, {SliceAxis::kRows, rows, 2 * rows},
                                                   absl::MakeSpan(part));
        !s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    const double quarter = Since(start);
    std::printf("%s: %.1f MB whole at %.2f GB/s; a quarter of its rows at %.2f GB/s\n", name,
                out.size() * 2 / 1e6, out.size() * 2 / whole / 1e9,
                part.size() * 2 / quarter / 1e9);
  }
  return 0;
}

}  // namespace
}  // namespace trident::model::generate

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return trident::model::generate::Main();
}
