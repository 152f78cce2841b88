#include "kernels/cpu/quantize.h"

#include <cmath>
#include <cstring>

namespace smdccl {

namespace {

// |x| of every value; NaN wins (so the scale carries it).
float maxAbsOf(const float* x, size_t n) {
  float m = 0.0f;
  bool nan = false;
  for (size_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    nan = nan || a != a;
    m = a > m ? a : m;
  }
  return nan ? NAN : m;
}

inline int8_t quantizeOne(float x, float inverse) {
  float r = x * inverse;
  r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);  // NaN falls through to lrintf
  return static_cast<int8_t>(r == r ? std::lrintf(r) : 0);
}

size_t blocksOf(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

}  // namespace

Int8Scale int8ScaleOf(float maxAbs) {
  if (maxAbs == 0.0f) return {0.0f, 0.0f};
  if (!std::isfinite(maxAbs)) return {NAN, 0.0f};
  return {maxAbs / 127.0f, 127.0f / maxAbs};
}

void quantizeInt8(void* dst, const float* src, size_t n) {
  char* out = static_cast<char*>(dst);
  int8_t* q = reinterpret_cast<int8_t*>(out + blocksOf(n) * sizeof(float));
  for (size_t b = 0, i = 0; i < n; ++b, i += kInt8Block) {
    const size_t m = n - i < kInt8Block ? n - i : kInt8Block;
    const Int8Scale s = int8ScaleOf(maxAbsOf(src + i, m));
    std::memcpy(out + b * sizeof(float), &s.scale, sizeof(float));
    for (size_t j = 0; j < m; ++j) q[i + j] = quantizeOne(src[i + j], s.inverse);
  }
}

namespace {

// fn(first, values, scale, bytes) for each block of a quantized piece of n.
template <typename Fn>
void eachBlock(const void* src, size_t n, Fn fn) {
  const char* in = static_cast<const char*>(src);
  const int8_t* q = reinterpret_cast<const int8_t*>(in + blocksOf(n) * sizeof(float));
  for (size_t b = 0, i = 0; i < n; ++b, i += kInt8Block) {
    float s;
    std::memcpy(&s, in + b * sizeof(float), sizeof(float));
    fn(i, n - i < kInt8Block ? n - i : kInt8Block, s, q + i);
  }
}

}  // namespace

void dequantizeAddInt8(float* dst, const float* a, const void* src, size_t n) {
  eachBlock(src, n, [&](size_t i, size_t m, float s, const int8_t* q) {
    for (size_t j = 0; j < m; ++j) dst[i + j] = a[i + j] + static_cast<float>(q[j]) * s;
  });
}

void dequantizeInt8(float* dst, const void* src, size_t n) {
  eachBlock(src, n, [&](size_t i, size_t m, float s, const int8_t* q) {
    for (size_t j = 0; j < m; ++j) dst[i + j] = static_cast<float>(q[j]) * s;
  });
}

}  // namespace smdccl
