// reduceMulti (kernels.h).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"
#include <cstdint>

namespace smdccl::cuda {
namespace {

using namespace detail;

// The inputs, by value in the kernel's parameters (peers' IPC mappings).
struct InPtrs {
  const void* p[kMaxReduceInputs];
};

// 16-byte vectors a thread keeps in flight per input and pass: about 32
// accumulators per thread whatever the element size (16 for the 16-bit
// types, whose MIN/MAX would spill at 64 registers).
template <DType D>
__host__ __device__ constexpr int unrollFor() {
  constexpr int v = 16 / static_cast<int>(sizeof(typename Elem<D>::T));
  constexpr int u = (v == 8 ? 16 : 32) / v;
  return u < 1 ? 1 : (u > 4 ? 4 : u);
}

// Vectors i, i + nth, ... (U of them) of out = in[0] op in[1] op ... op in[k-1].
template <DType D, RedOp OP, int U>
__device__ __forceinline__ void reduceVectors(const InPtrs& in, int k, uint4* o, size_t i,
                                              size_t nth) {
  using E = Elem<D>;
  using VT = Vec16<typename E::T>;
  constexpr int V = VT::V;
  typename E::A acc[U][V];
  {
    const uint4* p = static_cast<const uint4*>(in.p[0]);
    VT r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u].u = p[i + u * nth];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[u][e] = E::widen(r[u].e[e]);
  }
#pragma unroll 1
  for (int j = 1; j < k; ++j) {
    const uint4* p = static_cast<const uint4*>(in.p[j]);
    VT r[U];
#pragma unroll
    for (int u = 0; u < U; ++u) r[u].u = p[i + u * nth];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int e = 0; e < V; ++e) acc[u][e] = applyOp<D, OP>(acc[u][e], E::widen(r[u].e[e]));
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    VT w;
#pragma unroll
    for (int e = 0; e < V; ++e) w.e[e] = E::narrow(acc[u][e]);
    o[i + u * nth] = w.u;
  }
}

// out = in[0] op in[1] op ... op in[k-1]. `vec` (every pointer 16-byte
// aligned): 16-byte vectors for count / V elements, then the last
// count % V; otherwise element by element.
template <DType D, RedOp OP>
__global__ void __launch_bounds__(kThreads, 2)
    reduceKernel(const __grid_constant__ InPtrs in, int k, void* out, size_t count, bool vec) {
  using E = Elem<D>;
  using T = typename E::T;
  constexpr int V = Vec16<T>::V;
  constexpr int U = unrollFor<D>();
  const size_t nvec = vec ? count / V : 0;
  const size_t tid = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t nth = static_cast<size_t>(gridDim.x) * blockDim.x;
  uint4* o = static_cast<uint4*>(out);
  size_t i = tid;
  for (; i + (U - 1) * nth < nvec; i += U * nth) reduceVectors<D, OP, U>(in, k, o, i, nth);
  for (; i < nvec; i += nth) reduceVectors<D, OP, 1>(in, k, o, i, nth);
  for (size_t x = nvec * V + tid; x < count; x += nth) {
    typename E::A acc = E::widen(static_cast<const T*>(in.p[0])[x]);
#pragma unroll 1
    for (int j = 1; j < k; ++j)
      acc = applyOp<D, OP>(acc, E::widen(static_cast<const T*>(in.p[j])[x]));
    static_cast<T*>(out)[x] = E::narrow(acc);
  }
}

// One reduce launch: k inputs (in.p), `count` elements into `out`; `vec`:
// every pointer 16-byte aligned.
struct ReduceLaunch {
  const InPtrs& in;
  int k;
  void* out;
  size_t count;
  bool vec;
  cudaStream_t stream;
  bool loadOnly = false;  // load the kernels (preloadKernels), launch nothing
};

template <DType D, RedOp OP>
cudaError_t launchReduce(const ReduceLaunch& l) {
  constexpr int V = 16 / static_cast<int>(sizeof(typename Elem<D>::T));
  constexpr auto K = reduceKernel<D, OP>;
  if (l.loadOnly) return loadKernel<K>();
  const unsigned grid = l.vec ? gridFor<K>(l.count / V, unrollFor<D>()) : gridFor<K>(l.count, 4);
  K<<<grid, kThreads, 0, l.stream>>>(l.in, l.k, l.out, l.count, l.vec);
  return cudaGetLastError();
}

template <DType D>
cudaError_t byOp(RedOp op, const ReduceLaunch& l) {
  switch (op) {
    case RedOp::Sum: return launchReduce<D, RedOp::Sum>(l);
    case RedOp::Prod: return launchReduce<D, RedOp::Prod>(l);
    case RedOp::Min: return launchReduce<D, RedOp::Min>(l);
    case RedOp::Max: return launchReduce<D, RedOp::Max>(l);
    default: break;
  }
  if constexpr (Elem<D>::kind != Kind::Float) {
    switch (op) {
      case RedOp::BAnd: return launchReduce<D, RedOp::BAnd>(l);
      case RedOp::BOr: return launchReduce<D, RedOp::BOr>(l);
      case RedOp::BXor: return launchReduce<D, RedOp::BXor>(l);
      default: break;
    }
  }
  return cudaErrorInvalidValue;
}

cudaError_t byType(DType dt, RedOp op, const ReduceLaunch& l) {
  switch (dt) {
    case DType::F32: return byOp<DType::F32>(op, l);
    case DType::F64: return byOp<DType::F64>(op, l);
    case DType::F16: return byOp<DType::F16>(op, l);
    case DType::BF16: return byOp<DType::BF16>(op, l);
    case DType::I8: return byOp<DType::I8>(op, l);
    case DType::I32: return byOp<DType::I32>(op, l);
    case DType::I64: return byOp<DType::I64>(op, l);
    case DType::U8: return byOp<DType::U8>(op, l);
    case DType::Bool: return byOp<DType::Bool>(op, l);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

cudaError_t reduceMulti(void* out, const void* const* in, int k, const Elementwise& e,
                        cudaStream_t stream) {
  if (k < 1 || k > kMaxReduceInputs || in == nullptr) return cudaErrorInvalidValue;
  if (e.count == 0) return cudaSuccess;
  InPtrs p{};
  bool vec = aligned16(out);
  for (int j = 0; j < k; ++j) {
    p.p[j] = in[j];
    vec = vec && aligned16(in[j]);
  }
  return byType(e.dt, e.op, {p, k, out, e.count, vec, stream});
}

cudaError_t preloadKernels() {
  cudaError_t first = cudaSuccess;
  auto keep = [&](cudaError_t e) {
    if (first == cudaSuccess && e != cudaSuccess && e != cudaErrorInvalidValue) first = e;
  };
  InPtrs none{};
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I8, DType::I32,
                   DType::I64, DType::U8, DType::Bool})
    for (RedOp op :
         {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max, RedOp::BAnd, RedOp::BOr, RedOp::BXor}) {
      // cudaErrorInvalidValue: a pair with no kernel (bitwise ops on floats).
      keep(byType(dt, op, {none, 0, nullptr, 0, false, nullptr, /*loadOnly=*/true}));
    }
  keep(preloadWireKernels());
  keep(preloadQuantizeKernels());
  return first;
}

}  // namespace smdccl::cuda
