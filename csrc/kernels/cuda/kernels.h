#pragma once
// GPU kernels of smdccl, callable from plain C++ (no torch, no CUDA headers
// beyond the runtime API). Every function enqueues on `stream` and returns
// the launch error (cudaSuccess when nothing went wrong); none synchronizes.
//
// Semantics match the CPU kernels (kernels/cpu/reduce.h) element for element:
// float16/bfloat16 are widened to float32 for the arithmetic and rounded once
// (round to nearest even); integer SUM/PRODUCT wrap; MIN/MAX propagate NaN;
// bool SUM/MAX are OR, PRODUCT/MIN are AND.
//
// Vectorized: 16-byte loads and stores when every pointer is 16-byte aligned,
// an element-wise path otherwise (and for the tail).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace smdccl::cuda {

// Inputs one multi-input reduce reads in one pass (the ranks of a node).
constexpr int kMaxReduceInputs = 16;

// `count` elements of `dt`, combined with `op`.
struct Elementwise {
  size_t count;
  DType dt;
  RedOp op;
};

// out[i] = in[0][i] op in[1][i] op ... op in[k-1][i], accumulated in order
// 0..k-1 (16-bit types in float32, rounded once at the end), 1 <= k <=
// kMaxReduceInputs. `in` is a host array of device pointers (peers' buffers
// mapped through CUDA IPC); out may alias any of them.
cudaError_t reduceMulti(void* out, const void* const* in, int k, const Elementwise& e,
                        cudaStream_t stream);

// ---- float32 data over a 16-bit wire (F16 or BF16, round to nearest even) ----
// dst16[i] = round(src[i]); counts finite values that became inf (fp16 only)
// into *overflows (device memory, may be null).
// The wire to pack to, and where fp16 overflows are counted.
struct WirePack {
  Wire w;
  unsigned long long* overflows = nullptr;
};
cudaError_t packToWire(void* dst16, const float* src, size_t n, const WirePack& to,
                       cudaStream_t stream);
// dst[i] = widen(src16[i]).
cudaError_t unpackFromWire(float* dst, const void* src16, size_t n, Wire w, cudaStream_t stream);

// ---- float32 data over the int8 wire (kernels/cpu/quantize.h's format) ----
// Bit for bit the CPU's quantizeInt8 / dequantizeAddInt8 / dequantizeInt8;
// dst / src of a quantized piece need no alignment.
cudaError_t quantizeInt8(void* dst, const float* src, size_t n, cudaStream_t stream);
// dst = a + decoded(src), float32 sums (a may be dst).
cudaError_t dequantizeAddInt8(float* dst, const float* a, const void* src, size_t n,
                              cudaStream_t stream);
cudaError_t dequantizeInt8(float* dst, const void* src, size_t n, cudaStream_t stream);

// ---- loading ----
// Loads every kernel above on the current device now (each dtype and op):
// under CUDA's lazy loading a kernel's first launch may wait for all GPU
// work of the context, which a stream waiting for this host never finishes.
// A GPU context calls it before its first collective.
cudaError_t preloadKernels();
// The wire kernels alone (part of preloadKernels()).
cudaError_t preloadWireKernels();
cudaError_t preloadQuantizeKernels();

}  // namespace smdccl::cuda
