#include "common/backend/testing/offload_scenario.h"

#include "absl/strings/str_cat.h"
#include "common/kv/paged_block_allocator.h"
#include "common/numeric/dtype.h"

namespace trident::backend::testing {

void MigrateToFake(const char* pool, const kv::KvCacheSpec& spec,
                   absl::Span<const int32_t> blocks, int32_t n, uint64_t handle,
                   transport::attention::FakeRemoteAttention& fake) {
  const size_t element = spec.element_size_bytes();
  std::vector<float> k(spec.num_kv_heads * spec.head_dim), v(k.size());
  for (int32_t layer = 0; layer < spec.num_layers; ++layer) {
    for (int32_t p = 0; p < n; ++p) {
      const int32_t block = blocks[p / spec.block_size], slot = p % spec.block_size;
      for (int32_t h = 0; h < spec.num_kv_heads; ++h) {
        const uint64_t within = (uint64_t(h) * spec.block_size + slot) * spec.head_dim * element;
        numeric::ToFloat(spec.dtype, pool + spec.KeyOffsetBytes(layer, block) + within,
                         &k[h * spec.head_dim], spec.head_dim);
        numeric::ToFloat(spec.dtype, pool + spec.ValueOffsetBytes(layer, block) + within,
                         &v[h * spec.head_dim], spec.head_dim);
      }
      fake.WriteKv(handle, layer, p, k.data(), v.data());
    }
  }
}

std::vector<engine::EngineRequest> OffloadScenarioRequests() {
  std::vector<engine::EngineRequest> requests;
  for (int i = 0; i < 4; ++i) {
    engine::EngineRequest r;
    r.id = absl::StrCat("r", i);
    for (int k = 0; k < 20 + 7 * i; ++k) r.prompt.push_back((k * 31 + i * 7) % 400 + 1);
    r.max_tokens = 24;
    r.sampling.temperature = 0;
    requests.push_back(r);
  }
  return requests;
}

OffloadScenarioRun RunOffloadScenario(
    ModelBackend& backend, transport::attention::FakeRemoteAttention& fake,
    const std::vector<engine::EngineRequest>& requests, bool offload,
    const std::function<void(absl::Span<const int32_t>, int32_t, uint64_t)>& migrate) {
  OffloadScenarioRun run;
  kv::PagedBlockAllocator allocator(backend.kv_capacity().num_blocks);
  engine::EngineCore core(&backend, &allocator, {});
  core.set_remote_listener([&](const std::string&, const RemoteKv& remote) {
    if (remote.service == &fake) ++run.released;
  });
  for (const auto& r : requests) {
    if (!core.Add(r).ok()) ++run.step_errors;
  }
  for (int step = 0; core.HasWork(); ++step) {
    if (offload && step == 6) {
      for (const engine::OffloadCandidate& c : core.OffloadCandidates()) {
        const uint64_t handle = fake.Admit();
        migrate(c.blocks, c.num_computed, handle);
        if (!core.MoveToRemote(c.id, RemoteKv{&fake, handle}).ok()) ++run.moves_failed;
      }
      run.remote_at_move = core.stats().remote_running;
    }
    if (offload && step == 14) fake.Kill();
    auto events = core.Step();
    if (!events.ok()) {
      ++run.step_errors;
      break;
    }
    for (const auto& ev : *events) {
      if (ev.finish == engine::FinishReason::kError) ++run.step_errors;
      run.tokens[ev.request_id].push_back(ev.token);
    }
  }
  run.stats = core.stats();
  run.blocks_leaked = allocator.num_total() - allocator.num_free();
  return run;
}

}  // namespace trident::backend::testing
