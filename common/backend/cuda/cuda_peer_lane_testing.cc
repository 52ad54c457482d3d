#include "common/backend/cuda/cuda_peer_lane_testing.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/backend/cuda/cuda_util.h"
#include "common/model/generate/model_gen.h"
#include "common/model/generate/random_weights.h"
#include "common/status/status_macros.h"

namespace trident::backend::peer_lane_testing {
namespace {

std::vector<model::KvViewPiece> AllPieces(const PoolShape& shape, bool write) {
  const uint64_t total = shape.spec.TotalBytes();
  if (!shape.view.has_value()) return {{0, 0, 0, total}};
  return *shape.view->Map(0, total, write);
}

// Marks the child's replies among whatever else reaches its stdout.
constexpr char kReplyMark[] = "@@ ";

// The child's loop: one command a line on stdin, one reply a line on stdout.
int RunChild() {
  std::unique_ptr<DevicePools> pools;
  std::unique_ptr<CudaKvPeerLane> lane;
  std::optional<PoolShape> shape;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (w.empty()) continue;
    absl::Status status;
    std::string reply = "ok";
    if (w[0] == "exit") break;
    if (w[0] == "pools" && w.size() == 6) {
      const int32_t size = std::stoi(w[2]), blocks = std::stoi(w[3]), device = std::stoi(w[4]);
      const uint32_t seed = static_cast<uint32_t>(std::stoul(w[5]));
      absl::StatusOr<model::ModelConfig> config = PresetConfig(w[1]);
      absl::StatusOr<PoolShape> s =
          config.ok() ? ShapeOf(*config, size, blocks) : absl::StatusOr<PoolShape>(config.status());
      absl::StatusOr<std::unique_ptr<DevicePools>> p =
          s.ok() ? DevicePools::Create(*s, device)
                 : absl::StatusOr<std::unique_ptr<DevicePools>>(s.status());
      status = p.status();
      if (status.ok()) {
        shape = *std::move(s);
        pools = *std::move(p);
        if (seed != 0)
          status =
              pools->Fill(ScatterView(*shape, RandomViewBytes(shape->spec.TotalBytes(), seed)));
      }
      absl::StatusOr<std::unique_ptr<CudaKvPeerLane>> l =
          status.ok() ? CudaKvPeerLane::Create(*config, shape->spec, pools->ranks())
                      : absl::StatusOr<std::unique_ptr<CudaKvPeerLane>>(status);
      absl::StatusOr<KvPeerExport> e =
          l.ok() ? (*l)->Export() : absl::StatusOr<KvPeerExport>(l.status());
      status = e.status();
      if (status.ok()) {
        lane = *std::move(l);
        std::vector<std::string> hex;
        for (const std::string& h : e->rank_handles) hex.push_back(absl::BytesToHexString(h));
        reply = absl::StrCat("handles ", absl::StrJoin(hex, " "));
      }
    } else if (w[0] == "dump" && w.size() == 2 && pools != nullptr) {
      absl::StatusOr<std::vector<std::vector<uint8_t>>> bytes = pools->Read();
      status = bytes.status();
      if (status.ok()) {
        std::ofstream out(w[1], std::ios::binary);
        for (const auto& rank : *bytes)
          out.write(reinterpret_cast<const char*>(rank.data()), rank.size());
        if (!out) status = absl::InternalError(absl::StrCat("cannot write ", w[1]));
      }
    } else {
      status = absl::InvalidArgumentError(absl::StrCat("bad command: ", line));
    }
    if (!status.ok()) reply = absl::StrCat("error ", status.ToString());
    // One line each: the parent reads up to the newline.
    for (char& c : reply)
      if (c == '\n') c = ' ';
    std::cout << kReplyMark << reply << std::endl;
  }
  lane.reset();
  pools.reset();
  return 0;
}

}  // namespace

absl::StatusOr<model::ModelConfig> PresetConfig(const std::string& preset) {
  TRIDENT_ASSIGN_OR_RETURN(model::generate::ModelSpec spec, model::generate::PresetSpec(preset));
  TRIDENT_ASSIGN_OR_RETURN(auto weights, model::generate::RandomWeights::Create(spec));
  return weights->config();
}

absl::StatusOr<PoolShape> ShapeOf(const model::ModelConfig& config, int32_t size,
                                  int32_t num_blocks) {
  PoolShape shape;
  shape.spec = {.num_layers = config.num_hidden_layers,
                .num_kv_heads = config.num_key_value_heads,
                .head_dim = config.head_dim,
                .block_size = 16,
                .dtype = numeric::DType::kBF16,
                .num_blocks = num_blocks};
  shape.rank_bytes = shape.spec.TotalBytes();
  if (size > 0) {
    TRIDENT_ASSIGN_OR_RETURN(model::KvView view, model::KvView::ForPool(config, size, shape.spec));
    shape.rank_bytes = view.rank_spec().TotalBytes();
    shape.view = std::move(view);
  }
  return shape;
}

std::vector<uint8_t> RandomViewBytes(uint64_t bytes, uint32_t seed) {
  std::vector<uint8_t> out(bytes);
  std::mt19937 rng(seed);
  for (uint64_t i = 0; i < bytes; i += 4) {
    const uint32_t v = rng();
    std::memcpy(out.data() + i, &v, std::min<uint64_t>(4, bytes - i));
  }
  return out;
}

std::vector<std::vector<uint8_t>> ScatterView(const PoolShape& shape,
                                              const std::vector<uint8_t>& view_bytes) {
  std::vector<std::vector<uint8_t>> pools(shape.ranks(), std::vector<uint8_t>(shape.rank_bytes));
  for (const model::KvViewPiece& p : AllPieces(shape, /*write=*/true)) {
    std::memcpy(pools[p.rank].data() + p.rank_offset, view_bytes.data() + p.view_offset, p.bytes);
  }
  return pools;
}

bool GatherView(const PoolShape& shape, const std::vector<std::vector<uint8_t>>& pools,
                std::vector<uint8_t>* view_bytes) {
  view_bytes->assign(shape.spec.TotalBytes(), 0);
  for (const model::KvViewPiece& p : AllPieces(shape, /*write=*/false)) {
    std::memcpy(view_bytes->data() + p.view_offset, pools[p.rank].data() + p.rank_offset, p.bytes);
  }
  for (const model::KvViewPiece& p : AllPieces(shape, /*write=*/true)) {
    if (std::memcmp(view_bytes->data() + p.view_offset, pools[p.rank].data() + p.rank_offset,
                    p.bytes) != 0) {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::unique_ptr<DevicePools>> DevicePools::Create(const PoolShape& shape,
                                                                 int32_t device) {
  DeviceGuard guard(device);
  TRIDENT_RETURN_IF_ERROR(guard.status());
  std::unique_ptr<DevicePools> pools(new DevicePools({}));
  for (int32_t r = 0; r < shape.ranks(); ++r) {
    void* base = nullptr;
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMalloc(&base, shape.rank_bytes), "cudaMalloc"));
    pools->ranks_.push_back({device, static_cast<char*>(base), shape.rank_bytes});
    TRIDENT_RETURN_IF_ERROR(CudaCheck(cudaMemset(base, 0, shape.rank_bytes), "cudaMemset"));
  }
  return pools;
}

DevicePools::~DevicePools() {
  for (const auto& r : ranks_) {
    DeviceGuard guard(r.device);
    cudaFree(r.base);
  }
}

absl::Status DevicePools::Fill(const std::vector<std::vector<uint8_t>>& pools) {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    DeviceGuard guard(ranks_[r].device);
    TRIDENT_RETURN_IF_ERROR(CudaCheck(
        cudaMemcpy(ranks_[r].base, pools[r].data(), ranks_[r].bytes, cudaMemcpyHostToDevice),
        "fill"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> DevicePools::Read() const {
  std::vector<std::vector<uint8_t>> out;
  for (const auto& r : ranks_) {
    DeviceGuard guard(r.device);
    out.emplace_back(r.bytes);
    TRIDENT_RETURN_IF_ERROR(
        CudaCheck(cudaMemcpy(out.back().data(), r.base, r.bytes, cudaMemcpyDeviceToHost), "read"));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<PeerProcess>> PeerProcess::Start() {
  int to[2], from[2];
  if (pipe(to) != 0 || pipe(from) != 0) return absl::InternalError("pipe");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork");
  if (pid == 0) {
    dup2(to[0], 0);
    dup2(from[1], 1);
    close(to[1]);
    close(from[0]);
    char exe[] = "/proc/self/exe";
    char flag[] = "--peer_lane_child";
    char* argv[] = {exe, flag, nullptr};
    execv(exe, argv);
    _exit(127);
  }
  close(to[0]);
  close(from[1]);
  return std::unique_ptr<PeerProcess>(new PeerProcess(pid, to[1], from[0]));
}

PeerProcess::~PeerProcess() {
  const std::string bye = "exit\n";
  if (write(to_child_, bye.data(), bye.size()) < 0) kill(pid_, SIGKILL);
  close(to_child_);
  close(from_child_);
  int status = 0;
  waitpid(pid_, &status, 0);
}

absl::StatusOr<std::string> PeerProcess::Command(const std::string& line) {
  const std::string out = line + "\n";
  if (write(to_child_, out.data(), out.size()) != static_cast<ssize_t>(out.size())) {
    return absl::InternalError("the peer process is gone");
  }
  std::string reply;
  while (true) {
    reply.clear();
    char c = 0;
    while (true) {
      const ssize_t n = read(from_child_, &c, 1);
      if (n <= 0) return absl::InternalError(absl::StrCat("the peer process ended; got: ", reply));
      if (c == '\n') break;
      reply.push_back(c);
    }
    if (absl::StartsWith(reply, kReplyMark)) break;  // else the child's other output
  }
  reply = reply.substr(sizeof(kReplyMark) - 1);
  if (absl::StartsWith(reply, "error ")) {
    return absl::InternalError(absl::StrCat("peer: ", reply.substr(6)));
  }
  return reply;
}

absl::StatusOr<KvPeerExport> PeerProcess::Pools(const std::string& preset, int32_t size,
                                                int32_t num_blocks, int32_t device, uint32_t seed) {
  TRIDENT_ASSIGN_OR_RETURN(
      const std::string reply,
      Command(absl::StrCat("pools ", preset, " ", size, " ", num_blocks, " ", device, " ", seed)));
  std::vector<std::string> w = absl::StrSplit(reply, ' ', absl::SkipEmpty());
  if (w.empty() || w[0] != "handles") return absl::InternalError(absl::StrCat("peer: ", reply));
  KvPeerExport e;
  for (size_t i = 1; i < w.size(); ++i) e.rank_handles.push_back(absl::HexStringToBytes(w[i]));
  return e;
}

absl::StatusOr<std::vector<std::vector<uint8_t>>> PeerProcess::Dump(int32_t ranks,
                                                                    uint64_t rank_bytes) {
  char path[] = "/tmp/peer_lane_dump_XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return absl::InternalError("mkstemp");
  close(fd);
  TRIDENT_RETURN_IF_ERROR(Command(absl::StrCat("dump ", path)).status());
  std::ifstream in(path, std::ios::binary);
  std::vector<std::vector<uint8_t>> out(ranks, std::vector<uint8_t>(rank_bytes));
  for (auto& r : out) in.read(reinterpret_cast<char*>(r.data()), r.size());
  const bool ok = static_cast<bool>(in);
  unlink(path);
  if (!ok) return absl::InternalError("short dump");
  return out;
}

bool MaybeRunPeerChild(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peer_lane_child") == 0) {
      RunChild();
      return true;
    }
  }
  return false;
}

}  // namespace trident::backend::peer_lane_testing
