#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace smdccl {

namespace {

// The largest |x| of the values; NaN if any is NaN (so the scale carries it).
float maxAbsOf(const float* x, size_t n) {
  size_t i = 0;
  float m = 0.0f;
  bool nan = false;
#if defined(__SSE2__)
  const __m128 abs = _mm_castsi128_ps(_mm_set1_epi32(0x7fffffff));
  __m128 vm = _mm_setzero_ps(), vnan = _mm_setzero_ps();
  for (; i + 4 <= n; i += 4) {
    __m128 v = _mm_loadu_ps(x + i);
    vnan = _mm_or_ps(vnan, _mm_cmpunord_ps(v, v));
    vm = _mm_max_ps(vm, _mm_and_ps(v, abs));
  }
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, vm);
  m = std::max(std::max(lanes[0], lanes[1]), std::max(lanes[2], lanes[3]));
  nan = _mm_movemask_ps(vnan) != 0;
#endif
  for (; i < n; ++i) {
    float a = std::fabs(x[i]);
    nan = nan || a != a;
    m = a > m ? a : m;
  }
  return nan ? NAN : m;
}

// q = round-half-even(x * inverse) clamped to [-127, 127], for finite x
// and inverse (the current rounding mode is round-to-nearest-even).
void quantizeBlock(int8_t* q, const float* x, size_t m, float inverse) {
  size_t j = 0;
#if defined(__SSE2__)
  const __m128 inv = _mm_set1_ps(inverse), hi = _mm_set1_ps(127.0f), lo = _mm_set1_ps(-127.0f);
  for (; j + 16 <= m; j += 16) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) {
      __m128 r = _mm_mul_ps(_mm_loadu_ps(x + j + 4 * k), inv);
      v[k] = _mm_cvtps_epi32(_mm_min_ps(_mm_max_ps(r, lo), hi));
    }
    __m128i packed = _mm_packs_epi16(_mm_packs_epi32(v[0], v[1]), _mm_packs_epi32(v[2], v[3]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(q + j), packed);
  }
#endif
  for (; j < m; ++j) {
    float r = x[j] * inverse;
    r = r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r);
    q[j] = static_cast<int8_t>(std::lrintf(r));
  }
}

size_t blocksOf(size_t n) { return (n + kInt8Block - 1) / kInt8Block; }

}  // namespace

Int8Scale int8ScaleOf(float maxAbs) {
  if (!std::isfinite(maxAbs)) return {NAN, 0.0f};
  const float inverse = 127.0f / maxAbs;
  // Zero, or below 127 / FLT_MAX: the step 127 / m overflows (x * inf would
  // make a zero NaN), and the block is sent as zeros.
  if (std::isinf(inverse)) return {0.0f, 0.0f};
  return {maxAbs / 127.0f, inverse};
}

void quantizeInt8(void* dst, const float* src, size_t n) {
  char* out = static_cast<char*>(dst);
  int8_t* q = reinterpret_cast<int8_t*>(out + blocksOf(n) * sizeof(float));
  for (size_t b = 0, i = 0; i < n; ++b, i += kInt8Block) {
    const size_t m = n - i < kInt8Block ? n - i : kInt8Block;
    const Int8Scale s = int8ScaleOf(maxAbsOf(src + i, m));
    std::memcpy(out + b * sizeof(float), &s.scale, sizeof(float));
    if (s.scale == s.scale) quantizeBlock(q + i, src + i, m, s.inverse);
    else std::memset(q + i, 0, m);  // inf or NaN: the NaN scale decodes the block as NaN
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
