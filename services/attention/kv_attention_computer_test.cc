#include "services/attention/kv_attention_computer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/testing/status_matchers.h"
#include "common/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/attention/kv_store/heap_kv_pool.h"

namespace trident::attention {
namespace {

using ::testing::HasSubstr;
using transport::attention::RequestHeader;
using transport::attention::RequestView;
using transport::attention::SequenceEntry;
using transport::attention::WireDType;
using ::trident::testing::IsOk;
using ::trident::testing::StatusIs;

constexpr int32_t kLayers = 2, kQHeads = 4, kKvHeads = 2, kHeadDim = 16;
constexpr int32_t kQ = kQHeads * kHeadDim, kKv = kKvHeads * kHeadDim, kRow = kQ + 2 * kKv;
constexpr uint64_t kIncarnation = 3;

// Plain attention over the rows a sequence was sent, as the decoder computes it.
std::vector<float> Reference(const std::vector<std::vector<float>>& rows_sent, int32_t layer_rows) {
  const std::vector<float>& last = rows_sent.back();
  std::vector<float> o(kQ, 0.0f);
  for (int32_t qh = 0; qh < kQHeads; ++qh) {
    const int32_t kvh = qh / (kQHeads / kKvHeads);
    std::vector<double> scores;
    double max_score = -1e300;
    for (const std::vector<float>& r : rows_sent) {
      double dot = 0;
      for (int d = 0; d < kHeadDim; ++d)
        dot += last[qh * kHeadDim + d] * r[kQ + kvh * kHeadDim + d];
      scores.push_back(dot / std::sqrt(double{kHeadDim}));
      max_score = std::max(max_score, scores.back());
    }
    double sum = 0;
    for (double& s : scores) sum += s = std::exp(s - max_score);
    for (size_t t = 0; t < rows_sent.size(); ++t) {
      for (int d = 0; d < kHeadDim; ++d) {
        o[qh * kHeadDim + d] +=
            static_cast<float>(scores[t] / sum * rows_sent[t][kQ + kKv + kvh * kHeadDim + d]);
      }
    }
  }
  (void)layer_rows;
  return o;
}

struct Param {
  numeric::DType dtype;
  kernels::cpu::DecodeIsa isa;
  KvPacking packing = KvPacking::kAuto;  // bf16: pairs.
};

class KvAttentionComputerTest : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (!kernels::cpu::DecodeIsaAvailable(GetParam().isa)) {
      GTEST_SKIP() << "this CPU lacks " << kernels::cpu::DecodeIsaName(GetParam().isa);
    }
    ASSERT_THAT(store_.Connect("w0", kIncarnation), IsOk());
    auto computer =
        KvAttentionComputer::Create(&store_,
                                    Executor{.threads = 3,
                                             .run =
                                                 [](const std::function<void(int)>& fn) {
                                                   for (int t = 0; t < 3; ++t) fn(t);
                                                 }},
                                    GetParam().isa);
    ASSERT_THAT(computer.status(), IsOk());
    computer_ = *std::move(computer);
    EXPECT_EQ(computer_->isa(), GetParam().isa);
  }
  uint64_t Admit(const std::string& id, int32_t capacity) {
    auto admitted = store_.Admit(SequenceSpec{.owner_id = "w0",
                                              .owner_incarnation = kIncarnation,
                                              .sequence_id = id,
                                              .num_layers = kLayers,
                                              .num_q_heads = kQHeads,
                                              .num_kv_heads = kKvHeads,
                                              .head_dim = kHeadDim,
                                              .dtype = GetParam().dtype,
                                              .capacity_tokens = capacity,
                                              .packing = GetParam().packing});
    EXPECT_THAT(admitted.status(), IsOk());
    return admitted.ok() ? admitted->handle : 0;
  }
  // A request's data: entry i names handles[i] at positions[i], and
  // write_row(i, dst) writes its row.
  static std::vector<uint64_t> Pack(const RequestHeader& h, const std::vector<uint64_t>& handles,
                                    const std::vector<int32_t>& positions,
                                    const std::function<void(size_t, char*)>& write_row) {
    std::vector<uint64_t> data((RequestDataBytes(h) + 7) / 8);
    auto* entries = reinterpret_cast<SequenceEntry*>(data.data());
    char* rows = reinterpret_cast<char*>(entries + handles.size());
    const size_t row_bytes = QkvRowElements(h) * WireElementSize(h.dtype);
    for (size_t i = 0; i < handles.size(); ++i) {
      entries[i] = SequenceEntry{.handle = handles[i], .position = positions[i]};
      write_row(i, rows + i * row_bytes);
    }
    return data;
  }
  static absl::StatusOr<transport::attention::RequestView> View(const RequestHeader& h,
                                                                const std::vector<uint64_t>& data) {
    return transport::attention::DecodeRequest(
        transport::attention::EncodeRequestHeader(h),
        absl::string_view(reinterpret_cast<const char*>(data.data()), RequestDataBytes(h)));
  }
  static RequestHeader Header(int32_t layer, size_t sequences, WireDType wire,
                              uint64_t incarnation = kIncarnation, uint8_t flags = 0) {
    return RequestHeader{.dtype = wire,
                         .flags = flags,
                         .owner_incarnation = incarnation,
                         .layer = layer,
                         .num_sequences = static_cast<int32_t>(sequences),
                         .num_q_heads = kQHeads,
                         .num_kv_heads = kKvHeads,
                         .head_dim = kHeadDim};
  }
  // Sends one request for `handles` at `positions` with `rows` (one per
  // sequence), returning the status and o.
  absl::Status Send(int32_t layer, const std::vector<uint64_t>& handles,
                    const std::vector<int32_t>& positions,
                    const std::vector<std::vector<float>>& rows, std::vector<float>* o,
                    uint64_t incarnation = kIncarnation, WireDType wire = WireDType::kF32) {
    const RequestHeader h = Header(layer, handles.size(), wire, incarnation);
    const std::vector<uint64_t> data = Pack(h, handles, positions, [&](size_t i, char* dst) {
      transport::attention::ToWire(wire, rows[i].data(), dst, kRow);
    });
    auto view = View(h, data);
    if (!view.ok()) return view.status();
    o->assign(handles.size() * kQ, -7.0f);
    if (wire == WireDType::kF32)
      return computer_->Compute(*view, reinterpret_cast<char*>(o->data()));
    // The reply comes in the request's format.
    std::vector<char> reply(o->size() * WireElementSize(wire));
    const absl::Status status = computer_->Compute(*view, reply.data());
    if (status.ok()) transport::attention::FromWire(wire, reply.data(), o->data(), o->size());
    return status;
  }
  // An append-only request: token first + i of `handle` gets the k and v
  // of rows[i] (their q part is not sent).
  absl::Status AppendOnly(int32_t layer, uint64_t handle, int32_t first,
                          const std::vector<std::vector<float>>& rows) {
    const RequestHeader h = Header(layer, rows.size(), WireDType::kF32, kIncarnation,
                                   transport::attention::kAppendOnly);
    std::vector<int32_t> positions(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) positions[i] = first + static_cast<int32_t>(i);
    const std::vector<uint64_t> data =
        Pack(h, std::vector<uint64_t>(rows.size(), handle), positions, [&](size_t i, char* dst) {
          std::memcpy(dst, rows[i].data() + kQ, 2 * kKv * sizeof(float));
        });
    auto view = View(h, data);
    if (!view.ok()) return view.status();
    return computer_->Compute(*view, nullptr);
  }
  std::vector<float> RandomRow() {
    std::vector<float> row(kRow);
    for (float& x : row) x = dist_(rng_);
    return row;
  }

  std::mt19937 rng_{20261124};
  std::uniform_real_distribution<float> dist_{-1.0f, 1.0f};
  FakeClock clock_;
  HeapKvPool pool_{64 << 20};
  SequenceStore store_{&pool_, &clock_};
  std::unique_ptr<KvAttentionComputer> computer_;
};

TEST_P(KvAttentionComputerTest, DecodesEachSequenceOverEverythingAppendedToIt) {
  std::printf("seed 20261124\n");
  const uint64_t a = Admit("a", 40), b = Admit("b", 40);
  std::vector<std::vector<float>> sent_a[kLayers], sent_b[kLayers];
  // b joins at step 17 (a block boundary passed), a runs 35 steps. Layer 0
  // is sent f32, layer 1 bf16 (into a bf16 store: stored as it comes), the
  // rows rounded to bf16 first so that the reference sees what was sent.
  for (int32_t step = 0; step < 35; ++step) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      const WireDType wire = layer % 2 == 0 ? WireDType::kF32 : WireDType::kBF16;
      auto row = [&] {
        std::vector<float> r = RandomRow();
        if (wire == WireDType::kBF16) {
          for (float& x : r) x = numeric::Bf16ToFloat(numeric::FloatToBf16(x));
        }
        return r;
      };
      std::vector<uint64_t> handles = {a};
      std::vector<int32_t> positions = {step};
      std::vector<std::vector<float>> rows = {row()};
      sent_a[layer].push_back(rows[0]);
      if (step >= 17) {
        handles.push_back(b);
        positions.push_back(step - 17);
        rows.push_back(row());
        sent_b[layer].push_back(rows[1]);
      }
      std::vector<float> o;
      ASSERT_THAT(Send(layer, handles, positions, rows, &o, kIncarnation, wire), IsOk());
      const double tolerance =
          GetParam().dtype == numeric::DType::kF32 && wire == WireDType::kF32 ? 1e-5 : 2e-2;
      std::vector<float> want = Reference(sent_a[layer], 0);
      for (int j = 0; j < kQ; ++j) ASSERT_NEAR(o[j], want[j], tolerance) << step << " " << j;
      if (step >= 17) {
        want = Reference(sent_b[layer], 0);
        for (int j = 0; j < kQ; ++j) ASSERT_NEAR(o[kQ + j], want[j], tolerance) << step;
      }
    }
  }
  EXPECT_EQ(store_.Stats().held_tokens, 35 + 18);
  EXPECT_GT(computer_->kv_bytes_read(), 0);
}

TEST_P(KvAttentionComputerTest, ALargeAppendSplitOverTheThreadsStoresEveryToken) {
  // 100 tokens in one append-only request (a migration's chunk: split over
  // the executor's 3 threads), then a decode step over all of them.
  constexpr int32_t kTokens = 100;
  static_assert(kTokens >= KvAttentionComputer::kParallelRows);
  const uint64_t a = Admit("a", kTokens + 1);
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<std::vector<float>> rows;
    for (int32_t t = 0; t < kTokens; ++t) rows.push_back(RandomRow());
    ASSERT_THAT(AppendOnly(layer, a, 0, rows), IsOk());
    rows.push_back(RandomRow());
    std::vector<float> o;
    ASSERT_THAT(Send(layer, {a}, {kTokens}, {rows.back()}, &o), IsOk());
    const double tolerance = GetParam().dtype == numeric::DType::kF32 ? 1e-5 : 2e-2;
    const std::vector<float> want = Reference(rows, 0);
    for (int j = 0; j < kQ; ++j) ASSERT_NEAR(o[j], want[j], tolerance) << layer << " " << j;
  }
  EXPECT_EQ(store_.Stats().held_tokens, kTokens + 1);
}

TEST_P(KvAttentionComputerTest, ADecodeStepOfManySequencesSplitOverTheThreadsAnswersEach) {
  // 7 sequences of 3-9 tokens (their rows and answers split over the 3
  // threads), decoding together, bf16 on the wire both ways.
  constexpr int kSeqs = 7;
  static_assert(kSeqs >= KvAttentionComputer::kParallelRows);
  std::vector<uint64_t> handles;
  std::vector<std::vector<std::vector<float>>> sent(kSeqs);
  for (int i = 0; i < kSeqs; ++i) handles.push_back(Admit(absl::StrCat("s", i), 16));
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    std::vector<int32_t> positions;
    std::vector<std::vector<float>> step;
    for (int i = 0; i < kSeqs; ++i) {
      std::vector<std::vector<float>>& rows = sent[i];
      rows.clear();
      for (int t = 0; t < 2 + i; ++t) rows.push_back(RandomRow());
      ASSERT_THAT(AppendOnly(layer, handles[i], 0, rows), IsOk());
      rows.push_back(RandomRow());
      // What the wire carries is bf16: the reference sees the same values.
      std::vector<float>& last = rows.back();
      std::vector<uint16_t> bits(last.size());
      numeric::FloatToBf16(last.data(), bits.data(), bits.size());
      numeric::Bf16ToFloat(bits.data(), last.data(), bits.size());
      positions.push_back(static_cast<int32_t>(rows.size()) - 1);
      step.push_back(last);
    }
    std::vector<float> o;
    ASSERT_THAT(Send(layer, handles, positions, step, &o, kIncarnation, WireDType::kBF16), IsOk());
    for (int i = 0; i < kSeqs; ++i) {
      const std::vector<float> want = Reference(sent[i], 0);
      for (int j = 0; j < kQ; ++j) {
        ASSERT_NEAR(o[i * kQ + j], want[j], 2e-2) << "layer " << layer << " sequence " << i;
      }
    }
  }
}

TEST_P(KvAttentionComputerTest, ABadSequenceFailsTheRequestAndUnpinsTheRest) {
  const uint64_t a = Admit("a", 16);
  std::vector<float> o;
  const std::vector<std::vector<float>> two = {RandomRow(), RandomRow()};
  EXPECT_THAT(Send(0, {a, a + 100}, {0, 0}, two, &o), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(Send(0, {a}, {1000}, {two[0]}, &o), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(Send(kLayers, {a}, {0}, {two[0]}, &o),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  EXPECT_THAT(Send(0, {a}, {0}, {two[0]}, &o, kIncarnation + 1),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(o[0], -7.0f);
  // Nothing stayed pinned: a release frees the memory at once.
  ASSERT_THAT(store_.Release("w0", kIncarnation, a), IsOk());
  EXPECT_EQ(pool_.used_bytes(), 0u);
}

// A sequence admitted over an in-place prefix (two blocks standing for the
// block store's, in its rows layout) attends over them where they are,
// beside a sequence of the service's own layout in the same requests;
// the prefix takes no writes, and its borrow goes back with the sequence.
TEST_P(KvAttentionComputerTest, ASequenceOverAnInPlacePrefixReadsItWhereItIs) {
  constexpr int32_t kBlock = 16, kPrefixBlocks = 2, kPrefix = kBlock * kPrefixBlocks;
  const numeric::DType dtype = GetParam().dtype;
  const size_t element = numeric::ElementSize(dtype);
  const size_t half = size_t{kKvHeads} * kBlock * kHeadDim * element;
  // The prefix's rows, each layer's, rounded to the KV dtype.
  std::vector<std::vector<float>> sent[kLayers];
  std::vector<std::vector<char>> blocks(kPrefixBlocks, std::vector<char>(kLayers * 2 * half));
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    for (int32_t t = 0; t < kPrefix; ++t) {
      std::vector<float> row = RandomRow();
      if (dtype == numeric::DType::kBF16) {
        for (float& x : row) x = numeric::Bf16ToFloat(numeric::FloatToBf16(x));
      }
      sent[layer].push_back(row);
      for (int32_t h = 0; h < kKvHeads; ++h) {
        for (int32_t d = 0; d < kHeadDim; ++d) {
          for (int v = 0; v < 2; ++v) {
            const float x = row[kQ + v * kKv + h * kHeadDim + d];
            char* dst = blocks[t / kBlock].data() + layer * 2 * half + v * half +
                        ((h * kBlock + t % kBlock) * kHeadDim + d) * element;
            if (dtype == numeric::DType::kBF16) {
              const uint16_t bits = numeric::FloatToBf16(x);
              std::memcpy(dst, &bits, 2);
            } else {
              std::memcpy(dst, &x, 4);
            }
          }
        }
      }
    }
  }
  // Shared: a failed assertion leaves the sequence to the store's
  // destructor, which returns the borrow after this body ended.
  auto returned = std::make_shared<int>(0);
  InPlacePrefix prefix{.release = [returned] { ++*returned; }};
  for (const std::vector<char>& b : blocks) prefix.blocks.push_back(b.data());
  auto admitted = store_.Admit(SequenceSpec{.owner_id = "w0",
                                            .owner_incarnation = kIncarnation,
                                            .sequence_id = "in-place",
                                            .num_layers = kLayers,
                                            .num_q_heads = kQHeads,
                                            .num_kv_heads = kKvHeads,
                                            .head_dim = kHeadDim,
                                            .dtype = dtype,
                                            .capacity_tokens = kPrefix + 20,
                                            .block_size = kBlock,
                                            .packing = KvPacking::kRows},
                               std::move(prefix));
  ASSERT_THAT(admitted.status(), IsOk());
  EXPECT_EQ(admitted->layout.prefix_blocks, kPrefixBlocks);
  // Its own memory holds only the blocks after the prefix.
  EXPECT_EQ(admitted->reserved_bytes, size_t{kLayers} * 2 * 2 * half);
  const uint64_t p = admitted->handle;
  const uint64_t own = Admit("own", 20);
  EXPECT_THAT(AppendOnly(0, p, kPrefix - 1, {RandomRow()}),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("in-place prefix")));
  std::vector<std::vector<float>> sent_own[kLayers];
  const double tolerance = dtype == numeric::DType::kF32 ? 1e-5 : 2e-2;
  for (int32_t step = 0; step < 18; ++step) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      const std::vector<std::vector<float>> rows = {RandomRow(), RandomRow()};
      sent[layer].push_back(rows[0]);
      sent_own[layer].push_back(rows[1]);
      std::vector<float> o;
      ASSERT_THAT(Send(layer, {p, own}, {kPrefix + step, step}, rows, &o), IsOk());
      std::vector<float> want = Reference(sent[layer], 0);
      for (int j = 0; j < kQ; ++j) ASSERT_NEAR(o[j], want[j], tolerance) << step << " " << j;
      want = Reference(sent_own[layer], 0);
      for (int j = 0; j < kQ; ++j) ASSERT_NEAR(o[kQ + j], want[j], tolerance) << step;
    }
  }
  EXPECT_EQ(store_.Stats().in_place_sequences, 1);
  EXPECT_EQ(store_.Stats().in_place_tokens, kPrefix);
  EXPECT_EQ(*returned, 0);
  ASSERT_THAT(store_.Release("w0", kIncarnation, p), IsOk());
  EXPECT_EQ(*returned, 1);
  ASSERT_THAT(store_.Release("w0", kIncarnation, own), IsOk());
  EXPECT_EQ(pool_.used_bytes(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    KvDTypesAndIsas, KvAttentionComputerTest,
    ::testing::Values(Param{numeric::DType::kF32, kernels::cpu::DecodeIsa::kAvx2},
                      Param{numeric::DType::kBF16, kernels::cpu::DecodeIsa::kAvx2},
                      Param{numeric::DType::kF32, kernels::cpu::DecodeIsa::kAvx512Bf16},
                      Param{numeric::DType::kBF16, kernels::cpu::DecodeIsa::kAvx512Bf16},
                      Param{numeric::DType::kBF16, kernels::cpu::DecodeIsa::kAmx},
                      Param{numeric::DType::kBF16, kernels::cpu::DecodeIsa::kAvx512Bf16,
                            KvPacking::kRows}),
    [](const auto& info) {
      return absl::StrCat(numeric::DTypeName(info.param.dtype), "_",
                          kernels::cpu::DecodeIsaName(info.param.isa),
                          info.param.packing == KvPacking::kRows ? "_rows" : "");
    });

}  // namespace
}  // namespace trident::attention
