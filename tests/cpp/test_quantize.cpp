// The int8 wire's block format (kernels/cpu/quantize.h).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "check.h"
#include "kernels/cpu/quantize.h"

using namespace smdccl;

namespace {

std::vector<float> sample(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (size_t i = 0; i < n; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    // Mostly small values, some a hundred times larger: blocks of unlike scales.
    double u = static_cast<double>(s >> 11) / 9007199254740992.0 - 0.5;
    x[i] = static_cast<float>(u * ((s >> 60) == 0 ? 100.0 : 1.0));
  }
  return x;
}

}  // namespace

TEST(int8_layout_and_bytes) {
  CHECK(int8Bytes(0) == 0);
  CHECK(int8Bytes(1) == 5);
  CHECK(int8Bytes(kInt8Block) == kInt8Block + 4);
  CHECK(int8Bytes(kInt8Block + 1) == kInt8Block + 1 + 8);
  // Scales first, one per block, then the bytes.
  std::vector<float> x(kInt8Block + 3, 0.0f);
  x[0] = -2.0f;
  x[kInt8Block] = 0.5f;
  std::vector<char> q(int8Bytes(x.size()));
  quantizeInt8(q.data(), x.data(), x.size());
  float s0, s1;
  std::memcpy(&s0, q.data(), 4);
  std::memcpy(&s1, q.data() + 4, 4);
  CHECK(s0 == 2.0f / 127.0f && s1 == 0.5f / 127.0f);
  CHECK(static_cast<int8_t>(q[8]) == -127 && static_cast<int8_t>(q[8 + kInt8Block]) == 127);
}

TEST(int8_round_trip_within_half_a_step) {
  for (size_t n : {size_t{1}, size_t{7}, kInt8Block - 1, kInt8Block, size_t{1000}, size_t{65537}}) {
    std::vector<float> x = sample(n, n), back(n), sum(n), base(n, 0.25f);
    std::vector<char> q(int8Bytes(n));
    quantizeInt8(q.data(), x.data(), n);
    dequantizeInt8(back.data(), q.data(), n);
    dequantizeAddInt8(sum.data(), base.data(), q.data(), n);
    bool ok = true;
    for (size_t b = 0; b < n; b += kInt8Block) {
      size_t e = std::min(n, b + kInt8Block);
      float m = 0.0f;
      for (size_t i = b; i < e; ++i) m = std::max(m, std::fabs(x[i]));
      const double step = m / 127.0;
      for (size_t i = b; i < e; ++i) {
        ok = ok && std::fabs(static_cast<double>(back[i]) - x[i]) <= step / 2 + std::fabs(x[i]) * 0x1p-22;
        ok = ok && sum[i] == 0.25f + back[i];  // one float32 addition
      }
    }
    CHECK(ok);
    CHECK(base[0] == 0.25f);  // the first operand is left as it was
  }
}

TEST(int8_zero_and_non_finite_blocks) {
  std::vector<float> x(3 * kInt8Block, 0.0f);
  x[kInt8Block + 5] = INFINITY;
  x[2 * kInt8Block] = 1.0f;
  x[2 * kInt8Block + 9] = NAN;
  x[3] = -0.0f;
  std::vector<char> q(int8Bytes(x.size()));
  std::vector<float> back(x.size(), 7.0f);
  quantizeInt8(q.data(), x.data(), x.size());
  dequantizeInt8(back.data(), q.data(), x.size());
  bool zeros = true, nans = true;
  for (size_t i = 0; i < kInt8Block; ++i) zeros = zeros && back[i] == 0.0f;
  for (size_t i = kInt8Block; i < 3 * kInt8Block; ++i) nans = nans && std::isnan(back[i]);
  CHECK(zeros);  // an all-zero block: zeros, no division by zero
  CHECK(nans);   // inf or NaN in a block: the whole block is NaN, loudly
}

// A block too small for 127 / m (m below 127 / FLT_MAX) goes as zeros, on
// the vector path and the scalar tail alike; one just above it keeps its
// values within half a step.
TEST(int8_blocks_too_small_for_a_step_are_zeros) {
  const float tiny = 1e-38f, small = 1e-36f;  // 127 / tiny overflows; 127 / small does not
  CHECK(std::isinf(127.0f / tiny) && !std::isinf(127.0f / small));
  std::vector<float> x(2 * kInt8Block + 5, 0.0f);
  for (size_t i = 0; i < kInt8Block; i += 3) x[i] = (i % 2 ? -tiny : tiny) * (i % 7 + 1) / 8;
  for (size_t i = kInt8Block; i < x.size(); i += 2)
    x[i] = (i % 4 ? -small : small) * (i % 5 + 1) / 5;
  x[3] = -tiny;  // the block's max, and a zero (x[1]) that 0 * inf would turn into NaN
  std::vector<char> q(int8Bytes(x.size()));
  std::vector<float> back(x.size(), 7.0f);
  quantizeInt8(q.data(), x.data(), x.size());
  dequantizeInt8(back.data(), q.data(), x.size());
  const Int8Scale s = int8ScaleOf(tiny);
  CHECK(s.scale == 0.0f && s.inverse == 0.0f);
  bool zeros = true, near = true;
  const size_t scaleBytes = 3 * sizeof(float);  // three blocks
  for (size_t i = 0; i < kInt8Block; ++i)
    zeros = zeros && back[i] == 0.0f && q[scaleBytes + i] == 0;
  for (size_t i = kInt8Block; i < x.size(); ++i)
    near = near && std::fabs(static_cast<double>(back[i]) - x[i]) <= small / 127.0 / 2 * 1.001;
  CHECK(zeros);
  CHECK(near);
}

// The same bits as the plain formula the GPU kernels follow.
TEST(int8_bits_follow_the_documented_formula) {
  std::vector<float> x = sample(5 * kInt8Block + 17, 99);
  std::vector<char> q(int8Bytes(x.size()));
  quantizeInt8(q.data(), x.data(), x.size());
  const size_t blocks = (x.size() + kInt8Block - 1) / kInt8Block;
  bool ok = true;
  for (size_t i = 0; i < x.size(); ++i) {
    size_t b = i / kInt8Block, e = std::min(x.size(), (b + 1) * kInt8Block);
    float m = 0.0f;
    for (size_t j = b * kInt8Block; j < e; ++j) m = std::max(m, std::fabs(x[j]));
    float r = x[i] * (127.0f / m);
    r = std::min(127.0f, std::max(-127.0f, r));
    ok = ok && static_cast<int8_t>(q[blocks * 4 + i]) == static_cast<int8_t>(std::nearbyint(r));
  }
  CHECK(ok);
}
