// float32 over a 16-bit wire: packToWire, unpackFromWire
// (kernels.h), bit for bit the CPU's wireKernels.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include <cstdint>

namespace smdccl::cuda {
namespace {

using namespace detail;

constexpr int kWireUnroll = 2;  // 8-element groups per thread and pass

template <bool BF>
__device__ __forceinline__ uint16_t toWire(float f) {
  if constexpr (BF) return floatToBf16(f);
  else return floatToF16(f);
}
template <bool BF>
__device__ __forceinline__ float fromWire(uint16_t h) {
  if constexpr (BF) return bf16ToFloat(h);
  else return f16ToFloat(h);
}

union F8 {  // 8 floats = 2 x 16 bytes
  uint4 u[2];
  float f[8];
};
union H8 {  // 8 16-bit values = 16 bytes
  uint4 u;
  uint16_t h[8];
};

// Vectors (8 elements: two 16-byte float loads, one 16-byte 16-bit store)
// when `vec`, then the tail; element by element otherwise. fp16: finite
// values that became inf are counted, one atomicAdd per block.
template <bool BF>
__global__ void __launch_bounds__(kThreads)
    packKernel(uint16_t* dst, const float* src, size_t n, bool vec, unsigned long long* overflows) {
  constexpr bool kCount = !BF;
  __shared__ unsigned long long blockCount;
  if (kCount && overflows != nullptr) {
    if (threadIdx.x == 0) blockCount = 0;
    __syncthreads();
  }
  unsigned cnt = 0;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nth = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t start = 0;
  if (vec) {
    const size_t nvec = n / 8;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    size_t i = tid;
    for (; i + (kWireUnroll - 1) * nth < nvec; i += kWireUnroll * nth) {
      F8 x[kWireUnroll];
#pragma unroll
      for (int u = 0; u < kWireUnroll; ++u) {
        x[u].u[0] = s[2 * (i + u * nth)];
        x[u].u[1] = s[2 * (i + u * nth) + 1];
      }
#pragma unroll
      for (int u = 0; u < kWireUnroll; ++u) {
        H8 h;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          h.h[e] = toWire<BF>(x[u].f[e]);
          if constexpr (kCount) cnt += fp16Overflows(x[u].f[e]) ? 1u : 0u;
        }
        d[i + u * nth] = h.u;
      }
    }
    for (; i < nvec; i += nth) {
      F8 x;
      x.u[0] = s[2 * i];
      x.u[1] = s[2 * i + 1];
      H8 h;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        h.h[e] = toWire<BF>(x.f[e]);
        if constexpr (kCount) cnt += fp16Overflows(x.f[e]) ? 1u : 0u;
      }
      d[i] = h.u;
    }
    start = nvec * 8;
  }
  for (size_t i = start + tid; i < n; i += nth) {
    float f = src[i];
    dst[i] = toWire<BF>(f);
    if constexpr (kCount) cnt += fp16Overflows(f) ? 1u : 0u;
  }
  if (kCount && overflows != nullptr) {
    cnt = __reduce_add_sync(0xffffffffu, cnt);
    if ((threadIdx.x & 31u) == 0 && cnt != 0)
      atomicAdd(&blockCount, static_cast<unsigned long long>(cnt));
    __syncthreads();
    if (threadIdx.x == 0 && blockCount != 0) atomicAdd(overflows, blockCount);
  }
}

template <bool BF>
__global__ void __launch_bounds__(kThreads)
    unpackKernel(float* dst, const uint16_t* src, size_t n, bool vec) {
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nth = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t start = 0;
  if (vec) {
    const size_t nvec = n / 8;
    const uint4* s = reinterpret_cast<const uint4*>(src);
    uint4* d = reinterpret_cast<uint4*>(dst);
    size_t i = tid;
    for (; i + (kWireUnroll - 1) * nth < nvec; i += kWireUnroll * nth) {
      H8 h[kWireUnroll];
#pragma unroll
      for (int u = 0; u < kWireUnroll; ++u) h[u].u = s[i + u * nth];
#pragma unroll
      for (int u = 0; u < kWireUnroll; ++u) {
        F8 x;
#pragma unroll
        for (int e = 0; e < 8; ++e) x.f[e] = fromWire<BF>(h[u].h[e]);
        d[2 * (i + u * nth)] = x.u[0];
        d[2 * (i + u * nth) + 1] = x.u[1];
      }
    }
    for (; i < nvec; i += nth) {
      H8 h;
      h.u = s[i];
      F8 x;
#pragma unroll
      for (int e = 0; e < 8; ++e) x.f[e] = fromWire<BF>(h.h[e]);
      d[2 * i] = x.u[0];
      d[2 * i + 1] = x.u[1];
    }
    start = nvec * 8;
  }
  for (size_t i = start + tid; i < n; i += nth) dst[i] = fromWire<BF>(src[i]);
}

template <bool BF>
cudaError_t launchPack(void* dst16, const float* src, size_t n, unsigned long long* overflows,
                       cudaStream_t stream) {
  const bool vec = aligned16(dst16) && aligned16(src);
  unsigned grid = vec ? gridFor<packKernel<BF>>(n / 8, kWireUnroll) : gridFor<packKernel<BF>>(n, 4);
  packKernel<BF>
      <<<grid, kThreads, 0, stream>>>(static_cast<uint16_t*>(dst16), src, n, vec, overflows);
  return cudaGetLastError();
}

template <bool BF>
cudaError_t launchUnpack(float* dst, const void* src16, size_t n, cudaStream_t stream) {
  const bool vec = aligned16(dst) && aligned16(src16);
  unsigned grid =
      vec ? gridFor<unpackKernel<BF>>(n / 8, kWireUnroll) : gridFor<unpackKernel<BF>>(n, 4);
  unpackKernel<BF><<<grid, kThreads, 0, stream>>>(dst, static_cast<const uint16_t*>(src16), n, vec);
  return cudaGetLastError();
}

}  // namespace

cudaError_t packToWire(void* dst16, const float* src, size_t n, const WirePack& to,
                       cudaStream_t stream) {
  const Wire w = to.w;
  unsigned long long* overflows = to.overflows;
  if (w != Wire::F16 && w != Wire::BF16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return w == Wire::BF16 ? launchPack<true>(dst16, src, n, nullptr, stream)
                         : launchPack<false>(dst16, src, n, overflows, stream);
}

cudaError_t unpackFromWire(float* dst, const void* src16, size_t n, Wire w, cudaStream_t stream) {
  if (w != Wire::F16 && w != Wire::BF16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return w == Wire::BF16 ? launchUnpack<true>(dst, src16, n, stream)
                         : launchUnpack<false>(dst, src16, n, stream);
}

cudaError_t preloadWireKernels() {
  for (cudaError_t e : {loadKernel<packKernel<false>>(), loadKernel<packKernel<true>>(),
                        loadKernel<unpackKernel<false>>(), loadKernel<unpackKernel<true>>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace smdccl::cuda
