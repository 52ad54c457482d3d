#ifndef TRIDENT_COMMON_SAMPLING_PHILOX_H_
#define TRIDENT_COMMON_SAMPLING_PHILOX_H_

// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel
// Random Numbers: As Easy as 1, 2, 3" (SC'11), with the constants Random123,
// cuRAND and PyTorch use. A counter-based generator has no state: the output
// is a pure function of (key, counter), so any position's random number can
// be computed directly, on the CPU or in a CUDA kernel, without replaying
// the draws before it. Everything here is integer arithmetic plus one exact
// float multiplication, so a device implementation reproduces it bit for bit.

#include <array>
#include <cstdint>

namespace trident::sampling {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // Multiplier of counter word 0.
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // Multiplier of counter word 2.
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // Key schedule (golden ratio).
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // Key schedule (sqrt(3) - 1).

// Ten Philox rounds over `counter` with `key` (Random123's philox4x32_R(10)).
constexpr PhiloxCounter Philox4x32_10(PhiloxCounter counter, PhiloxKey key) {
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    const uint64_t p0 = uint64_t{kPhiloxM0} * counter[0];
    const uint64_t p1 = uint64_t{kPhiloxM1} * counter[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    counter = {hi1 ^ counter[1] ^ key[0], lo1, hi0 ^ counter[3] ^ key[1], lo0};
  }
  return counter;
}

// The first 32-bit word of Philox4x32-10 with key {low, high half of `seed`}
// and counter {low, high half of `counter`, 0, 0}.
constexpr uint32_t PhiloxBits(uint64_t seed, uint64_t counter) {
  return Philox4x32_10({static_cast<uint32_t>(counter), static_cast<uint32_t>(counter >> 32), 0, 0},
                       {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)})[0];
}

// A uniform float in [0, 1) from PhiloxBits: its top 24 bits times 2^-24, so
// every value is an exact multiple of 2^-24 and 1 is never returned. (cuRAND's
// curand_uniform returns (0, 1] instead; a kernel must use this formula.)
// The sampler draws output position p with counter = p.
constexpr float UniformFromPhilox(uint64_t seed, uint64_t counter) {
  return static_cast<float>(PhiloxBits(seed, counter) >> 8) * 0x1.0p-24f;
}

}  // namespace trident::sampling

#endif  // TRIDENT_COMMON_SAMPLING_PHILOX_H_
