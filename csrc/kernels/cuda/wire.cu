// float32 over a 16-bit wire: packToWire, unpackFromWire
// (kernels.h), bit for bit the CPU's wireKernels.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include <cstdint>

namespace smdccl::cuda {
namespace {

using namespace detail;

constexpr int kWireUnroll = 2;  // 8-element groups per thread and pass

// fp16 or bf16: widen / narrow as the reduce kernels do.
template <bool BF>
using WireElem = Elem<BF ? DType::BF16 : DType::F16>;

union F8 {  // 8 floats = 2 x 16 bytes
  uint4 u[2];
  float f[8];
};
using H8 = Vec16<uint16_t>;  // 8 16-bit values = 16 bytes

// Vectors i, i + nth, ... (U of them) of 8 elements: two 16-byte float
// loads, one 16-byte 16-bit store each; returns the fp16 overflows.
template <bool BF, int U>
__device__ __forceinline__ unsigned packVectors(const uint4* s, uint4* d, size_t i, size_t nth) {
  unsigned cnt = 0;
  F8 x[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    x[u].u[0] = s[2 * (i + u * nth)];
    x[u].u[1] = s[2 * (i + u * nth) + 1];
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    H8 h;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      h.e[e] = WireElem<BF>::narrow(x[u].f[e]);
      if constexpr (!BF) cnt += fp16Overflows(x[u].f[e]) ? 1u : 0u;
    }
    d[i + u * nth] = h.u;
  }
  return cnt;
}

template <bool BF, int U>
__device__ __forceinline__ void unpackVectors(const uint4* s, uint4* d, size_t i, size_t nth) {
  H8 h[U];
#pragma unroll
  for (int u = 0; u < U; ++u) h[u].u = s[i + u * nth];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    F8 x;
#pragma unroll
    for (int e = 0; e < 8; ++e) x.f[e] = WireElem<BF>::widen(h[u].e[e]);
    d[2 * (i + u * nth)] = x.u[0];
    d[2 * (i + u * nth) + 1] = x.u[1];
  }
}

// Vectors when `vec`, then the tail; element by element otherwise. fp16:
// finite values that became inf are counted, one atomicAdd per block.
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
  const size_t nvec = vec ? n / 8 : 0;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  size_t i = tid;
  for (; i + (kWireUnroll - 1) * nth < nvec; i += kWireUnroll * nth)
    cnt += packVectors<BF, kWireUnroll>(s, d, i, nth);
  for (; i < nvec; i += nth) cnt += packVectors<BF, 1>(s, d, i, nth);
  for (size_t x = nvec * 8 + tid; x < n; x += nth) {
    float f = src[x];
    dst[x] = WireElem<BF>::narrow(f);
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
  const size_t nvec = vec ? n / 8 : 0;
  const uint4* s = reinterpret_cast<const uint4*>(src);
  uint4* d = reinterpret_cast<uint4*>(dst);
  size_t i = tid;
  for (; i + (kWireUnroll - 1) * nth < nvec; i += kWireUnroll * nth)
    unpackVectors<BF, kWireUnroll>(s, d, i, nth);
  for (; i < nvec; i += nth) unpackVectors<BF, 1>(s, d, i, nth);
  for (size_t x = nvec * 8 + tid; x < n; x += nth) dst[x] = WireElem<BF>::widen(src[x]);
}

// Wire kernel K over n elements: by vectors where both pointers are 16-byte aligned.
template <auto K, typename D, typename S, typename... More>
cudaError_t launchWire(D* dst, const S* src, size_t n, cudaStream_t stream, More... more) {
  const bool vec = aligned16(dst) && aligned16(src);
  const unsigned grid = vec ? gridFor<K>(n / 8, kWireUnroll) : gridFor<K>(n, 4);
  K<<<grid, kThreads, 0, stream>>>(dst, src, n, vec, more...);
  return cudaGetLastError();
}

}  // namespace

cudaError_t packToWire(void* dst16, const float* src, size_t n, const WirePack& to,
                       cudaStream_t stream) {
  const Wire w = to.w;
  if (w != Wire::F16 && w != Wire::BF16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  auto* d16 = static_cast<uint16_t*>(dst16);
  // bf16 has no overflow to count (its range is float32's).
  return w == Wire::BF16 ? launchWire<packKernel<true>>(d16, src, n, stream, to.overflows)
                         : launchWire<packKernel<false>>(d16, src, n, stream, to.overflows);
}

cudaError_t unpackFromWire(float* dst, const void* src16, size_t n, Wire w, cudaStream_t stream) {
  if (w != Wire::F16 && w != Wire::BF16) return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  auto* s16 = static_cast<const uint16_t*>(src16);
  return w == Wire::BF16 ? launchWire<unpackKernel<true>>(dst, s16, n, stream)
                         : launchWire<unpackKernel<false>>(dst, s16, n, stream);
}

cudaError_t preloadWireKernels() {
  for (cudaError_t e : {loadKernel<packKernel<false>>(), loadKernel<packKernel<true>>(),
                        loadKernel<unpackKernel<false>>(), loadKernel<unpackKernel<true>>()})
    if (e != cudaSuccess) return e;
  return cudaSuccess;
}

}  // namespace smdccl::cuda
