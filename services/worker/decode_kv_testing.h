#ifndef TRIDENT_SERVICES_WORKER_DECODE_KV_TESTING_H_
#define TRIDENT_SERVICES_WORKER_DECODE_KV_TESTING_H_

// What a test of the decode side hands a DecodeService in place of the
// worker server's parts: reservations on the engine's KV blocks, and an
// in-process KV receiver (transport::FakeKvReceiver) that describes a small
// host pool of the same block size and takes messages into those
// reservations.

#include <cstdint>
#include <string>
#include <utility>

#include "common/engine/engine.h"
#include "common/kv/kv_layout.h"
#include "common/time/clock.h"
#include "common/transport/kv/fake_kv_receiver.h"
#include "services/worker/kv_handoff/engine_block_source.h"
#include "services/worker/kv_handoff/kv_reservations.h"

namespace trident::worker {

// Thread-safe as its parts are. Destroy it after the DecodeService and
// before the engine.
struct DecodeKvForTests {
  // `engine` and `clock` (not owned) must outlive this. The receiver's
  // endpoint is `owner_id` in `incarnation`; its pool has `num_blocks`
  // blocks of `block_size` tokens, one layer, one head of dimension 1.
  DecodeKvForTests(engine::Engine* engine, const Clock* clock, std::string owner_id,
                   uint64_t incarnation, int32_t block_size, int32_t num_blocks)
      : blocks(engine),
        reservations(&blocks, clock, KvReservationOptions{.block_size = block_size}),
        receiver(std::move(owner_id), incarnation,
                 kv::KvCacheSpec{.num_layers = 1,
                                 .num_kv_heads = 1,
                                 .head_dim = 1,
                                 .block_size = block_size,
                                 .dtype = numeric::DType::kF32,
                                 .num_blocks = num_blocks},
                 &reservations) {}

  EngineBlockSource blocks;
  KvReservations reservations;
  transport::FakeKvReceiver receiver;
};

}  // namespace trident::worker

#endif  // TRIDENT_SERVICES_WORKER_DECODE_KV_TESTING_H_
