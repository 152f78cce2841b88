#pragma once
// Reduction loops written so the compiler vectorizes them. Included by one
// translation unit per instruction set (see reduce_*.cpp); each defines
// SMDCCL_REDUCE_NS and gets its own copy of the table.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cpu/reduce.h"

#if defined(SMDCCL_REDUCE_AVX2)
#include <immintrin.h>
#endif

namespace smdccl {
namespace SMDCCL_REDUCE_NS {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

struct Half16 {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};

static inline float bf16ToFloat(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
static inline uint16_t floatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quiet_nan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
static inline float f16ToFloat(uint16_t h) {
  _Float16 x;
  std::memcpy(&x, &h, 2);
  return static_cast<float>(x);
}
static inline uint16_t floatToF16(float f) {
  _Float16 x = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &x, 2);
  return h;
}

// Floating MIN/MAX as torch.minimum/maximum: NaN wins, and -0 is below +0.
// Either operand order gives the same bits: ranks that reduce the same
// values in another order (recursive doubling) agree, and so do the vector
// lanes and the scalar tail.
template <RedOp OP, typename T>
static inline T floatOp(T a, T b) {
  if constexpr (OP == RedOp::Sum) return a + b;
  else if constexpr (OP == RedOp::Prod) return a * b;
  else {
    if (a != a || b != b) return a + b;
    if (a == b) return (std::signbit(a) == (OP == RedOp::Min)) ? a : b;  // +-0: the sign wanted
    if constexpr (OP == RedOp::Min) return b < a ? b : a;
    else return b > a ? b : a;
  }
}

#if defined(SMDCCL_REDUCE_AVX2)
// Eight float32 lanes of floatOp (NaN-propagating MIN/MAX included).
// Equal lanes (+-0 among them) take a | b for MIN (-0 if either is) and
// a & b for MAX; vminps alone returns its second operand for +-0.
template <RedOp OP>
static inline __m256 vecOp(__m256 a, __m256 b) {
  if constexpr (OP == RedOp::Sum) return _mm256_add_ps(a, b);
  else if constexpr (OP == RedOp::Prod) return _mm256_mul_ps(a, b);
  else {
    __m256 r = OP == RedOp::Min ? _mm256_min_ps(a, b) : _mm256_max_ps(a, b);
    __m256 same = OP == RedOp::Min ? _mm256_or_ps(a, b) : _mm256_and_ps(a, b);
    r = _mm256_blendv_ps(r, same, _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
    __m256 nan = _mm256_cmp_ps(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_ps(r, _mm256_add_ps(a, b), nan);
  }
}
template <RedOp OP>
static inline __m256d vecOp(__m256d a, __m256d b) {
  if constexpr (OP == RedOp::Sum) return _mm256_add_pd(a, b);
  else if constexpr (OP == RedOp::Prod) return _mm256_mul_pd(a, b);
  else {
    __m256d r = OP == RedOp::Min ? _mm256_min_pd(a, b) : _mm256_max_pd(a, b);
    __m256d same = OP == RedOp::Min ? _mm256_or_pd(a, b) : _mm256_and_pd(a, b);
    r = _mm256_blendv_pd(r, same, _mm256_cmp_pd(a, b, _CMP_EQ_OQ));
    __m256d nan = _mm256_cmp_pd(a, b, _CMP_UNORD_Q);
    return _mm256_blendv_pd(r, _mm256_add_pd(a, b), nan);
  }
}
static inline __m256 bf16x8ToFloat(const uint16_t* p) {
  __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline void floatToBf16x8(uint16_t* p, __m256 f) {
  __m256i u = _mm256_castps_si256(f);
  __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
  __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
  __m256 isNan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  __m256i r = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet), isNan));
  // Pack the low 16 bits of the eight 32-bit lanes (values < 65536: no saturation).
  __m128i lo = _mm256_castsi256_si128(r), hi = _mm256_extracti128_si256(r, 1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_packus_epi32(lo, hi));
}
#endif

template <RedOp OP, typename T>
static void floatLoop(void* out, const void* a, const void* b, size_t n) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  size_t i = 0;
#if defined(SMDCCL_REDUCE_AVX2)
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(o + i, vecOp<OP>(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  } else {
    for (; i + 4 <= n; i += 4)
      _mm256_storeu_pd(o + i, vecOp<OP>(_mm256_loadu_pd(x + i), _mm256_loadu_pd(y + i)));
  }
#endif
  for (; i < n; ++i) o[i] = floatOp<OP>(x[i], y[i]);
}

// floatLoop for float32 with `out` written by non-temporal stores (AVX2;
// elsewhere plain ones): no read of out's lines first, and they do not
// evict the inputs. The head up to out's 32-byte alignment, and the tail,
// element by element.
template <RedOp OP>
static void floatStreamLoop(void* out, const void* a, const void* b, size_t n) {
#if defined(SMDCCL_REDUCE_AVX2)
  float* o = static_cast<float*>(out);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  size_t i = 0;
  for (; i < n && (reinterpret_cast<uintptr_t>(o + i) & 31) != 0; ++i) o[i] = floatOp<OP>(x[i], y[i]);
  for (; i + 8 <= n; i += 8)
    _mm256_stream_ps(o + i, vecOp<OP>(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  _mm_sfence();  // ordered like plain stores for whoever reads out next
  for (; i < n; ++i) o[i] = floatOp<OP>(x[i], y[i]);
#else
  floatLoop<OP, float>(out, a, b, n);
#endif
}

// Integers: SUM/PRODUCT in the unsigned type so overflow wraps (defined).
template <RedOp OP, typename T>
static void intLoop(void* out, const void* a, const void* b, size_t n) {
  using U = std::make_unsigned_t<T>;
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) {
    if constexpr (OP == RedOp::Sum)
      o[i] = static_cast<T>(static_cast<U>(x[i]) + static_cast<U>(y[i]));
    else if constexpr (OP == RedOp::Prod)
      o[i] = static_cast<T>(static_cast<U>(x[i]) * static_cast<U>(y[i]));
    else if constexpr (OP == RedOp::Min) o[i] = y[i] < x[i] ? y[i] : x[i];
    else if constexpr (OP == RedOp::Max) o[i] = y[i] > x[i] ? y[i] : x[i];
    else if constexpr (OP == RedOp::BAnd) o[i] = static_cast<T>(x[i] & y[i]);
    else if constexpr (OP == RedOp::BOr) o[i] = static_cast<T>(x[i] | y[i]);
    else o[i] = static_cast<T>(x[i] ^ y[i]);
  }
}

template <RedOp OP>
static void boolLoop(void* out, const void* a, const void* b, size_t n) {
  uint8_t* o = static_cast<uint8_t*>(out);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  for (size_t i = 0; i < n; ++i) {
    // Any nonzero byte is true; results are 0/1 (XOR: of the truth values).
    if constexpr (OP == RedOp::Sum || OP == RedOp::Max || OP == RedOp::BOr)
      o[i] = (x[i] | y[i]) ? 1 : 0;
    else if constexpr (OP == RedOp::BXor) o[i] = (x[i] != 0) != (y[i] != 0) ? 1 : 0;
    else o[i] = (x[i] && y[i]) ? 1 : 0;
  }
}

template <RedOp OP>
static void bf16Loop(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
#if defined(SMDCCL_REDUCE_AVX2)
  for (; i + 8 <= n; i += 8)
    floatToBf16x8(o + i, vecOp<OP>(bf16x8ToFloat(x + i), bf16x8ToFloat(y + i)));
#endif
  for (; i < n; ++i) o[i] = floatToBf16(floatOp<OP>(bf16ToFloat(x[i]), bf16ToFloat(y[i])));
}

template <RedOp OP>
static void f16Loop(void* out, const void* a, const void* b, size_t n) {
  uint16_t* o = static_cast<uint16_t*>(out);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
#if defined(SMDCCL_REDUCE_AVX2)
  for (; i + 8 <= n; i += 8) {
    __m256 fx = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    __m256 fy = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(y + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(o + i),
                     _mm256_cvtps_ph(vecOp<OP>(fx, fy), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) o[i] = floatToF16(floatOp<OP>(f16ToFloat(x[i]), f16ToFloat(y[i])));
}

// ---- the 16-bit wire: float32 <-> fp16/bf16, fused with the reduction ----
using PackFn = void (*)(uint16_t*, const float*, size_t);
using UnpackFn = void (*)(float*, const uint16_t*, size_t);

template <bool BF>
static inline uint16_t toWire(float f) {
  return BF ? floatToBf16(f) : floatToF16(f);
}
template <bool BF>
static inline float fromWire(uint16_t h) {
  return BF ? bf16ToFloat(h) : f16ToFloat(h);
}

#if defined(SMDCCL_REDUCE_AVX2)
template <bool BF>
static inline __m256 load8(const uint16_t* p) {
  if constexpr (BF) return bf16x8ToFloat(p);
  else return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
template <bool BF>
static inline void store8(uint16_t* p, __m256 f) {
  if constexpr (BF) floatToBf16x8(p, f);
  else
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
}
#endif

// fp16 rounds finite |x| >= 65520 to inf: that is an overflow (a NaN or an
// inf that was already there is not).
static inline bool fp16Overflows(float f) {
  float a = f < 0 ? -f : f;
  return a >= 65520.0f && a <= 3.4028235e38f;
}

template <bool BF>
static void packLoop(uint16_t* o, const float* x, size_t n) {
  size_t i = 0;
  bool overflow = false;
#if defined(SMDCCL_REDUCE_AVX2)
  if constexpr (BF) {
    for (; i + 8 <= n; i += 8) store8<BF>(o + i, _mm256_loadu_ps(x + i));
  } else {
    const __m256 absMask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 lo = _mm256_set1_ps(65520.0f), hi = _mm256_set1_ps(3.4028235e38f);
    __m256 bad = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      __m256 a = _mm256_and_ps(v, absMask);
      bad = _mm256_or_ps(
          bad, _mm256_and_ps(_mm256_cmp_ps(a, lo, _CMP_GE_OQ), _mm256_cmp_ps(a, hi, _CMP_LE_OQ)));
      store8<BF>(o + i, v);
    }
    overflow = _mm256_movemask_ps(bad) != 0;
  }
#endif
  for (; i < n; ++i) {
    o[i] = toWire<BF>(x[i]);
    if constexpr (!BF) overflow |= fp16Overflows(x[i]);
  }
  if (overflow) ++tlsFp16Overflows;
}

template <bool BF>
static void unpackLoop(float* o, const uint16_t* x, size_t n) {
  size_t i = 0;
#if defined(SMDCCL_REDUCE_AVX2)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(o + i, load8<BF>(x + i));
#endif
  for (; i < n; ++i) o[i] = fromWire<BF>(x[i]);
}

#if defined(SMDCCL_REDUCE_AVX2)
// Eight floats rounded to the wire's precision and back, in registers.
template <bool BF>
static inline __m256 round8(__m256 f) {
  if constexpr (BF) {
    alignas(32) uint16_t tmp[8];
    floatToBf16x8(tmp, f);
    return bf16x8ToFloat(tmp);
  } else {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT));
  }
}
#endif

// o[i] = a[i] op widen(x[i]) (a may be o): one pass, float32 arithmetic;
// ROUND: the sum is rounded to the wire's precision before it is stored (a
// final result).
template <RedOp OP, bool BF, bool ROUND>
static void reduceWireLoop(void* out, const void* first, const void* in, size_t n) {
  float* o = static_cast<float*>(out);
  const float* a = static_cast<const float*>(first);
  const uint16_t* x = static_cast<const uint16_t*>(in);
  size_t i = 0;
#if defined(SMDCCL_REDUCE_AVX2)
  for (; i + 8 <= n; i += 8) {
    __m256 r = vecOp<OP>(_mm256_loadu_ps(a + i), load8<BF>(x + i));
    if constexpr (ROUND) r = round8<BF>(r);
    _mm256_storeu_ps(o + i, r);
  }
#endif
  for (; i < n; ++i) {
    float r = floatOp<OP>(a[i], fromWire<BF>(x[i]));
    o[i] = ROUND ? fromWire<BF>(toWire<BF>(r)) : r;
  }
}

template <bool BF, bool ROUND>
static ReduceFn pickWireReduce(RedOp op) {
  switch (op) {
    case RedOp::Sum: return reduceWireLoop<RedOp::Sum, BF, ROUND>;
    case RedOp::Prod: return reduceWireLoop<RedOp::Prod, BF, ROUND>;
    case RedOp::Min: return reduceWireLoop<RedOp::Min, BF, ROUND>;
    default: return reduceWireLoop<RedOp::Max, BF, ROUND>;
  }
}

template <RedOp OP>
static ReduceFn pick(DType t) {
  switch (t) {
    case DType::F32: return floatLoop<OP, float>;
    case DType::F64: return floatLoop<OP, double>;
    case DType::F16: return f16Loop<OP>;
    case DType::BF16: return bf16Loop<OP>;
    case DType::I8: return intLoop<OP, int8_t>;
    case DType::I32: return intLoop<OP, int32_t>;
    case DType::I64: return intLoop<OP, int64_t>;
    case DType::U8: return intLoop<OP, uint8_t>;
    case DType::Bool: return boolLoop<OP>;
  }
  return nullptr;
}

// Bitwise ops: integer and bool loops only (nullptr for floating types,
// which the backend refuses before any data moves).
template <RedOp OP>
static ReduceFn pickBitwise(DType t) {
  switch (t) {
    case DType::I8: return intLoop<OP, int8_t>;
    case DType::I32: return intLoop<OP, int32_t>;
    case DType::I64: return intLoop<OP, int64_t>;
    case DType::U8: return intLoop<OP, uint8_t>;
    case DType::Bool: return boolLoop<OP>;
    default: return nullptr;
  }
}

inline ReduceFn lookup(DType t, RedOp op) {
  switch (op) {
    case RedOp::Sum: return pick<RedOp::Sum>(t);
    case RedOp::Prod: return pick<RedOp::Prod>(t);
    case RedOp::Min: return pick<RedOp::Min>(t);
    case RedOp::Max: return pick<RedOp::Max>(t);
    case RedOp::BAnd: return pickBitwise<RedOp::BAnd>(t);
    case RedOp::BOr: return pickBitwise<RedOp::BOr>(t);
    case RedOp::BXor: return pickBitwise<RedOp::BXor>(t);
  }
  return nullptr;
}

// float32 SUM, PRODUCT, MIN, MAX (by RedOp) with streamed stores.
inline ReduceFn lookupStreamF32(RedOp op) {
  switch (op) {
    case RedOp::Sum: return floatStreamLoop<RedOp::Sum>;
    case RedOp::Prod: return floatStreamLoop<RedOp::Prod>;
    case RedOp::Min: return floatStreamLoop<RedOp::Min>;
    case RedOp::Max: return floatStreamLoop<RedOp::Max>;
    default: return nullptr;
  }
}

inline ::smdccl::WireKernels wireKernels(bool bf16) {
  ::smdccl::WireKernels k;
  k.pack = bf16 ? packLoop<true> : packLoop<false>;
  k.unpack = bf16 ? unpackLoop<true> : unpackLoop<false>;
  for (int o = 0; o < kWireOps; ++o) {
    auto op = static_cast<RedOp>(o);
    k.reduce[o] = bf16 ? pickWireReduce<true, false>(op) : pickWireReduce<false, false>(op);
    k.reduceRound[o] = bf16 ? pickWireReduce<true, true>(op) : pickWireReduce<false, true>(op);
  }
  return k;
}

}  // namespace SMDCCL_REDUCE_NS
}  // namespace smdccl
