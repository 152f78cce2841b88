#pragma once
// Device helpers shared by the smdccl CUDA kernels: element traits (storage
// type, accumulation type, widening/rounding), the reduction operators with
// the CPU kernels' exact semantics (kernels/cpu/reduce_impl.h), and launch
// configuration.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "common/dtype.h"
#include "kernels/cuda/sm_cap.h"

namespace smdccl::cuda::detail {

constexpr int kThreads = 512;  // threads per block of the streaming kernels

// ---- float <-> 16-bit, round to nearest even, bit-identical to the CPU ----
__device__ __forceinline__ float bf16ToFloat(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
// The CPU's floatToBf16: RNE; a NaN keeps its top bits and is made quiet.
__device__ __forceinline__ uint16_t floatToBf16(float f) {
  uint32_t u = __float_as_uint(f);
  uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  uint32_t quietNan = (u >> 16) | 0x40u;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? quietNan : rounded);
}

__device__ __forceinline__ float f16ToFloat(uint16_t h) {
  return __half2float(__ushort_as_half(h));
}
// IEEE RNE (cvt.rn.f16.f32). A NaN keeps its sign and top payload bits and is
// made quiet, as F16C's vcvtps2ph does on the CPU (the hardware conversion
// would return a canonical NaN).
__device__ __forceinline__ uint16_t floatToF16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x3ffu));
  return __half_as_ushort(__float2half_rn(f));
}

// fp16 rounds finite |x| >= 65520 to inf: an overflow (NaN / inf are not).
__device__ __forceinline__ bool fp16Overflows(float f) {
  float a = fabsf(f);
  return a >= 65520.0f && a <= 3.4028235e38f;
}

// ---- operators: the CPU's floatOp / intLoop / boolLoop (bitwise ops:
// integer and bool only; byOp never instantiates them for floats) ----
template <RedOp OP, typename T>
__device__ __forceinline__ T floatOp(T a, T b) {
  if constexpr (OP == RedOp::Sum) {
    return a + b;
  } else if constexpr (OP == RedOp::Prod) {
    return a * b;
  } else {  // NaN wins, -0 below +0, either operand order
    if (a != a || b != b) return a + b;
    if (a == b) return ((signbit(a) != 0) == (OP == RedOp::Min)) ? a : b;  // int "nonzero" in CUDA
    if constexpr (OP == RedOp::Min) return b < a ? b : a;
    else return b > a ? b : a;
  }
}

template <RedOp OP, typename T>
__device__ __forceinline__ T intOp(T a, T b) {
  using U = std::make_unsigned_t<T>;
  if constexpr (OP == RedOp::Sum) return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  else if constexpr (OP == RedOp::Prod) return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  else if constexpr (OP == RedOp::Min) return b < a ? b : a;
  else if constexpr (OP == RedOp::Max) return b > a ? b : a;
  else if constexpr (OP == RedOp::BAnd) return static_cast<T>(a & b);
  else if constexpr (OP == RedOp::BOr) return static_cast<T>(a | b);
  else return static_cast<T>(a ^ b);
}

template <RedOp OP>
__device__ __forceinline__ uint8_t boolOp(uint8_t a, uint8_t b) {
  if constexpr (OP == RedOp::Sum || OP == RedOp::Max || OP == RedOp::BOr) return (a | b) ? 1 : 0;
  else if constexpr (OP == RedOp::BXor) return (a != 0) != (b != 0) ? 1 : 0;
  else return (a && b) ? 1 : 0;
}

// ---- element traits: T = storage, A = accumulation ----
enum class Kind { Float, Int, Bool };

template <DType D> struct Elem;
// Stored as computed.
template <typename X, Kind K> struct Same {
  using T = X; using A = X; static constexpr Kind kind = K;
  static __device__ __forceinline__ A widen(T x) { return x; }
  static __device__ __forceinline__ T narrow(A x) { return x; }
};
template <> struct Elem<DType::F32> : Same<float, Kind::Float> {};
template <> struct Elem<DType::F64> : Same<double, Kind::Float> {};
template <> struct Elem<DType::I8> : Same<int8_t, Kind::Int> {};
template <> struct Elem<DType::I32> : Same<int32_t, Kind::Int> {};
template <> struct Elem<DType::I64> : Same<int64_t, Kind::Int> {};
template <> struct Elem<DType::U8> : Same<uint8_t, Kind::Int> {};
template <> struct Elem<DType::Bool> : Same<uint8_t, Kind::Bool> {};
// 16-bit floats: summed as float32.
template <> struct Elem<DType::F16> {
  using T = uint16_t; using A = float; static constexpr Kind kind = Kind::Float;
  static __device__ __forceinline__ A widen(T x) { return f16ToFloat(x); }
  static __device__ __forceinline__ T narrow(A x) { return floatToF16(x); }
};
template <> struct Elem<DType::BF16> {
  using T = uint16_t; using A = float; static constexpr Kind kind = Kind::Float;
  static __device__ __forceinline__ A widen(T x) { return bf16ToFloat(x); }
  static __device__ __forceinline__ T narrow(A x) { return floatToBf16(x); }
};

template <DType D, RedOp OP>
__device__ __forceinline__ typename Elem<D>::A applyOp(typename Elem<D>::A a, typename Elem<D>::A b) {
  if constexpr (Elem<D>::kind == Kind::Float) return floatOp<OP>(a, b);
  else if constexpr (Elem<D>::kind == Kind::Int) return intOp<OP>(a, b);
  else return boolOp<OP>(a, b);
}

// 16 bytes seen as V elements of T (registers only).
template <typename T>
union Vec16 {
  static constexpr int V = 16 / sizeof(T);
  uint4 u;
  T e[V];
};

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// SMs of the current device, cached per device.
inline int smCount() {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0) return 1;
  if (dev < kMaxDevices) {
    int v = cache[dev].load(std::memory_order_relaxed);
    if (v > 0) return v;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms <= 0) {
    cudaGetLastError();
    return 1;
  }
  if (dev < kMaxDevices) cache[dev].store(sms, std::memory_order_relaxed);
  return sms;
}

// Resident blocks per SM of kernel K at kThreads threads (its registers
// decide), computed once per kernel.
template <auto K>
int blocksPerSm() {
  static std::atomic<int> cached{0};
  int v = cached.load(std::memory_order_relaxed);
  if (v > 0) return v;
  int n = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, K, kThreads, 0) != cudaSuccess || n <= 0) {
    cudaGetLastError();
    n = 1;
  }
  cached.store(n, std::memory_order_relaxed);
  return n;
}

// The SMs smdccl's kernels may fill on the current device (sm_cap.h).
inline int kernelSms() { return usableSms(smCount(), maxSms()); }

// Loads kernel K's code now. Under CUDA's lazy loading (torch's default) a
// kernel is loaded at its first launch, which may wait for all of the
// context's GPU work: behind a stream waiting for this host (a gate, a node
// barrier) that first launch would never return.
template <auto K>
cudaError_t loadKernel() {
  cudaFuncAttributes a;
  cudaError_t e = cudaFuncGetAttributes(&a, K);
  (void)blocksPerSm<K>();
  return e;
}

// Blocks for `work` units of which each thread takes `perThread` per pass:
// enough to cover the work, at most one full wave of kernel K (every usable
// SM holding all the blocks it can), so the grid-stride loops stay balanced.
template <auto K>
unsigned gridFor(size_t work, size_t perThread) {
  return static_cast<unsigned>(
      waveBlocks(work, static_cast<size_t>(kThreads) * perThread, kernelSms(), blocksPerSm<K>()));
}

}  // namespace smdccl::cuda::detail
