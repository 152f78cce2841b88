// The int8 wire's block format on the GPU: quantizeInt8, dequantizeInt8,
// dequantizeAddInt8 (kernels.h), bit for bit the CPU's
// (kernels/cpu/quantize.h): one warp per block of kInt8Block values, the
// same float32 operations in the same order, rounded explicitly (no fused
// multiply-add, IEEE division), round-half-even to int8.
#include "kernels/cpu/quantize.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include <cstdint>

namespace smdccl::cuda {
namespace {

using namespace detail;

constexpr int kWarp = 32;
constexpr int kPerLane = static_cast<int>(kInt8Block) / kWarp;
constexpr int kQuantThreads = 256;
static_assert(kInt8Block % kWarp == 0, "a block is whole lanes");

// A piece's scales lie at its start, which need not be 4-byte aligned.
__device__ __forceinline__ float loadScale(const unsigned char* p) {
  uint32_t u = p[0] | (p[1] << 8) | (p[2] << 16) | (static_cast<uint32_t>(p[3]) << 24);
  return __uint_as_float(u);
}
__device__ __forceinline__ void storeScale(unsigned char* p, float s) {
  uint32_t u = __float_as_uint(s);
  for (int k = 0; k < 4; ++k) p[k] = static_cast<unsigned char>(u >> (8 * k));
}

// Warp w of the grid handles blocks w, w + warps, ...
struct WarpBlocks {
  size_t first, step, count;
  int lane;
  __device__ WarpBlocks(size_t n)
      : first((static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp),
        step(static_cast<size_t>(gridDim.x) * blockDim.x / kWarp),
        count((n + kInt8Block - 1) / kInt8Block),
        lane(threadIdx.x % kWarp) {}
};

__global__ void __launch_bounds__(kQuantThreads)
    quantizeKernel(unsigned char* dst, const float* src, size_t n) {
  const WarpBlocks w(n);
  int8_t* q = reinterpret_cast<int8_t*>(dst + w.count * sizeof(float));
  for (size_t b = w.first; b < w.count; b += w.step) {
    const size_t base = b * kInt8Block;
    const size_t m = n - base < kInt8Block ? n - base : kInt8Block;
    float v[kPerLane];
    float mx = 0.0f;
    bool nan = false;
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const size_t i = static_cast<size_t>(w.lane + kWarp * k);
      v[k] = i < m ? src[base + i] : 0.0f;
      const float a = fabsf(v[k]);
      nan = nan || a != a;
      mx = a > mx ? a : mx;
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2)
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    nan = __any_sync(0xffffffffu, nan);
    // int8ScaleOf: inf or NaN -> (NaN, 0); 127 / m overflowing (zero, or
    // below 127 / FLT_MAX) -> (0, 0); else m / 127, 127 / m.
    float scale = 0.0f, inverse = 0.0f;
    if (nan || isinf(mx)) {
      scale = __int_as_float(0x7fc00000);
    } else if (const float inv = __fdiv_rn(127.0f, mx); !isinf(inv)) {
      scale = __fdiv_rn(mx, 127.0f);
      inverse = inv;
    }
    if (w.lane == 0) storeScale(dst + b * sizeof(float), scale);
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const size_t i = static_cast<size_t>(w.lane + kWarp * k);
      if (i >= m) continue;
      int r = 0;
      if (scale == scale) r = __float2int_rn(fminf(fmaxf(__fmul_rn(v[k], inverse), -127.0f), 127.0f));
      q[base + i] = static_cast<int8_t>(r);
    }
  }
}

// dst = a + decoded(src) (a == nullptr: dst = decoded(src)).
__global__ void __launch_bounds__(kQuantThreads)
    dequantizeKernel(float* dst, const float* a, const unsigned char* src, size_t n) {
  const WarpBlocks w(n);
  const int8_t* q = reinterpret_cast<const int8_t*>(src + w.count * sizeof(float));
  for (size_t b = w.first; b < w.count; b += w.step) {
    const size_t base = b * kInt8Block;
    const size_t m = n - base < kInt8Block ? n - base : kInt8Block;
    const float s = loadScale(src + b * sizeof(float));
#pragma unroll
    for (int k = 0; k < kPerLane; ++k) {
      const size_t i = base + static_cast<size_t>(w.lane + kWarp * k);
      if (i >= base + m) continue;
      const float d = __fmul_rn(static_cast<float>(q[i]), s);
      dst[i] = a ? __fadd_rn(a[i], d) : d;
    }
  }
}

// One warp per block of values, at most 8 CTAs per usable SM.
unsigned gridOf(size_t n) {
  return static_cast<unsigned>(
      waveBlocks((n + kInt8Block - 1) / kInt8Block, kQuantThreads / kWarp, kernelSms(), 8));
}

}  // namespace

cudaError_t quantizeInt8(void* dst, const float* src, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  quantizeKernel<<<gridOf(n), kQuantThreads, 0, stream>>>(static_cast<unsigned char*>(dst), src, n);
  return cudaGetLastError();
}

cudaError_t dequantizeAddInt8(float* dst, const float* a, const void* src, size_t n,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  dequantizeKernel<<<gridOf(n), kQuantThreads, 0, stream>>>(
      dst, a, static_cast<const unsigned char*>(src), n);
  return cudaGetLastError();
}

cudaError_t dequantizeInt8(float* dst, const void* src, size_t n, cudaStream_t stream) {
  return dequantizeAddInt8(dst, nullptr, src, n, stream);
}

cudaError_t preloadQuantizeKernels() {
  for (cudaError_t e : {loadKernel<quantizeKernel>(), loadKernel<dequantizeKernel>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace smdccl::cuda
