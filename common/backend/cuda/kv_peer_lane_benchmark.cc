// A prompt's KV GPU to GPU through the CUDA IPC lane (cuda_peer_lane.h) into
// another process's pool, against cudaMemcpyPeer of the same bytes between
// the same two GPUs in one call (the ceiling), measured in the same run.
// For each prompt length: the lane as a transfer uses it (one Copy per
// layer, then wait for the last), with the destination's blocks
//   runs       in one run per layer (a fresh reservation: collated),
//   scattered  shuffled (a fragmented pool: one copy per block, the
//              block-copy kernel), and
//   engines    shuffled, each block its own copy-engine call (no kernel),
// each the median of --iters.
//
//   kv_peer_lane_benchmark --preset=llama3-8b --tokens=1024,4096,8192,32768

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/backend/cuda/cuda_peer_lane.h"
#include "common/backend/cuda/cuda_peer_lane_testing.h"

ABSL_FLAG(std::string, preset, "llama3-8b", "Model preset whose KV shape is moved.");
ABSL_FLAG(std::string, tokens, "1024,2048,4096,8192,16384,32768", "Prompt lengths.");
ABSL_FLAG(int32_t, iters, 5, "Timed repetitions per figure (median).");
ABSL_FLAG(int32_t, engines_max_tokens, 8192,
          "Longest prompt timed with one copy-engine call per block.");
ABSL_FLAG(uint32_t, seed, 2026, "Seed of the shuffled block order.");
ABSL_FLAG(int32_t, streams, 2, "CudaPeerLaneOptions::streams of the lane.");

namespace trident::backend {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of one prompt through the lane: a Copy per layer, then the last
// one's end.
double TimeLane(KvPeerLane& lane, const std::shared_ptr<KvPeerPool>& peer,
                const std::vector<std::vector<KvPeerCopy>>& layers) {
  std::vector<absl::Notification> done(layers.size());
  const auto start = Clock::now();
  for (size_t l = 0; l < layers.size(); ++l) {
    lane.Copy(peer, layers[l], [&done, l](absl::Status s) {
      if (!s.ok()) std::fprintf(stderr, "copy failed: %s\n", s.ToString().c_str());
      done[l].Notify();
    });
  }
  for (auto& d : done) d.WaitForNotification();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::vector<std::vector<KvPeerCopy>> Plan(const kv::KvCacheSpec& spec, int32_t blocks,
                                          const std::vector<int32_t>* shuffled) {
  std::vector<std::vector<KvPeerCopy>> layers(spec.num_layers);
  const uint64_t stride = spec.block_stride_bytes();
  for (int32_t l = 0; l < spec.num_layers; ++l) {
    if (shuffled == nullptr) {
      layers[l].push_back({spec.KeyOffsetBytes(l, 0), spec.KeyOffsetBytes(l, 0), blocks * stride});
      continue;
    }
    for (int32_t b = 0; b < blocks; ++b) {
      layers[l].push_back(
          {spec.KeyOffsetBytes(l, b), spec.KeyOffsetBytes(l, (*shuffled)[b]), stride});
    }
  }
  return layers;
}

int Main() {
  std::vector<int32_t> tokens;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int32_t n = 0;
    if (!absl::SimpleAtoi(t, &n) || n < 16) {
      std::fprintf(stderr, "--tokens: bad length %s\n", std::string(t).c_str());
      return 2;
    }
    tokens.push_back(n);
  }
  const int32_t max_blocks = *std::max_element(tokens.begin(), tokens.end()) / 16;
  int count = 0;
  cudaGetDeviceCount(&count);
  const int32_t peer_device = count > 1 ? 1 : 0;
  const absl::StatusOr<model::ModelConfig> preset =
      peer_lane_testing::PresetConfig(absl::GetFlag(FLAGS_preset));
  if (!preset.ok()) {
    std::fprintf(stderr, "%s\n", preset.status().ToString().c_str());
    return 2;
  }
  const model::ModelConfig& config = *preset;
  auto shape = *peer_lane_testing::ShapeOf(config, 0, max_blocks);
  const uint64_t pool_bytes = shape.spec.TotalBytes();
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  std::printf(
      "%s KV (%llu bytes a token), cuda:0 -> cuda:%d (%s), pools of %.2f GiB, %d lane "
      "stream(s), seed %u\n",
      absl::GetFlag(FLAGS_preset).c_str(),
      static_cast<unsigned long long>(shape.spec.BytesPerBlockAllLayers() / 16), peer_device,
      prop.name, pool_bytes / double(1 << 30), absl::GetFlag(FLAGS_streams),
      absl::GetFlag(FLAGS_seed));

  auto peer = peer_lane_testing::PeerProcess::Start();
  auto exported = (*peer)->Pools(absl::GetFlag(FLAGS_preset), 0, max_blocks, peer_device, 0);
  if (!exported.ok()) {
    std::fprintf(stderr, "peer: %s\n", exported.status().ToString().c_str());
    return 1;
  }
  exported->spec = shape.spec;
  auto pools = *peer_lane_testing::DevicePools::Create(shape, 0);
  const int32_t streams = absl::GetFlag(FLAGS_streams);
  auto lane = *CudaKvPeerLane::Create(config, shape.spec, pools->ranks(), {.streams = streams});
  auto engines = *CudaKvPeerLane::Create(config, shape.spec, pools->ranks(),
                                         {.kernel_min_copies = 1 << 30, .streams = streams});
  auto mapped = lane->Open(*exported);
  auto mapped_engines = engines->Open(*exported);
  if (!mapped.ok() || !mapped_engines.ok()) {
    std::fprintf(stderr, "map: %s\n", mapped.status().ToString().c_str());
    return 1;
  }
  // The ceiling's destination: this process's own buffer on the peer GPU.
  void* peer_buffer = nullptr;
  cudaSetDevice(peer_device);
  cudaMalloc(&peer_buffer, pool_bytes);
  cudaSetDevice(0);
  if (peer_device != 0) cudaDeviceEnablePeerAccess(peer_device, 0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);

  std::printf(
      "| tokens | MiB | cudaMemcpyPeer GB/s | lane, runs GB/s | of peer | lane, scattered "
      "(kernel) GB/s | of peer | scattered, engines GB/s | of peer |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  std::mt19937 rng(absl::GetFlag(FLAGS_seed));
  const int32_t iters = std::max(1, absl::GetFlag(FLAGS_iters));
  for (int32_t t : tokens) {
    const int32_t blocks = t / 16;
    const double bytes = double(blocks) * shape.spec.BytesPerBlockAllLayers();
    std::vector<int32_t> shuffled(max_blocks);
    std::iota(shuffled.begin(), shuffled.end(), 0);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    const auto runs = Plan(shape.spec, blocks, nullptr);
    const auto scattered = Plan(shape.spec, blocks, &shuffled);
    std::vector<double> peer_s, runs_s, scattered_s, engines_s;
    for (int32_t i = 0; i <= iters; ++i) {  // the first round warms up
      const auto start = Clock::now();
      cudaMemcpyPeerAsync(peer_buffer, peer_device, pools->ranks()[0].base, 0,
                          static_cast<size_t>(bytes), stream);
      cudaStreamSynchronize(stream);
      const double p = std::chrono::duration<double>(Clock::now() - start).count();
      const double r = TimeLane(*lane, *mapped, runs);
      const double s = TimeLane(*lane, *mapped, scattered);
      const double e = t <= absl::GetFlag(FLAGS_engines_max_tokens)
                           ? TimeLane(*engines, *mapped_engines, scattered)
                           : 0;
      if (i == 0) continue;
      peer_s.push_back(p);
      runs_s.push_back(r);
      scattered_s.push_back(s);
      engines_s.push_back(e);
    }
    const double peer_gbs = bytes / Median(peer_s) / 1e9;
    const double runs_gbs = bytes / Median(runs_s) / 1e9;
    const double scattered_gbs = bytes / Median(scattered_s) / 1e9;
    const double e = Median(engines_s);
    std::printf("| %d | %.0f | %.1f | %.1f | %.2f | %.1f | %.2f | ", t, bytes / (1 << 20), peer_gbs,
                runs_gbs, runs_gbs / peer_gbs, scattered_gbs, scattered_gbs / peer_gbs);
    if (e > 0) {
      std::printf("%.1f | %.2f |\n", bytes / e / 1e9, bytes / e / 1e9 / peer_gbs);
    } else {
      std::printf("- | - |\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace trident::backend

int main(int argc, char** argv) {
  if (trident::backend::peer_lane_testing::MaybeRunPeerChild(argc, argv)) return 0;
  absl::ParseCommandLine(argc, argv);
  return trident::backend::Main();
}
