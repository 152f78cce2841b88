#pragma once
// Elementwise reductions on host memory: out[i] = a[i] op b[i] (out may alias
// a). float16/bfloat16 are widened to float32 for the arithmetic and rounded
// once (round-to-nearest-even). Integer SUM/PRODUCT wrap like torch's. MIN/MAX
// propagate NaN. bool: SUM/MAX are OR, PRODUCT/MIN are AND. BAND/BOR/BXOR:
// integer and bool data only (an InvalidArgument for floating types).
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace smdccl {

// The element type and the reduction of a kernel call.
struct ElementOp {
  DType dtype;
  RedOp op;
};
void reduceTo(void* out, const void* a, const void* b, size_t count, ElementOp e);

// The same, `out` (not aliasing a or b) written with non-temporal stores
// (float32 on AVX2; elsewhere reduceTo): no read of out's lines before they
// are written, and the caches keep the inputs. For a large result this op
// does not read again (an out-of-place reduce-scatter's own block).
void reduceToStreaming(void* out, const void* a, const void* b, size_t count, ElementOp e);
// The size from which a result is better written with reduceToStreaming:
// an eighth of the last-level cache (4 MiB when the OS does not say). Below
// it the result stays in cache for its reader; measured on a 32 MiB L3,
// 2-rank reduce_scatter: a 2 MiB block is faster cached, an 8 MiB one
// faster streamed.
size_t streamingOutBytes();

inline void reduceInto(void* dst, const void* src, size_t count, DType dtype, RedOp op) {
  reduceTo(dst, dst, src, count, {dtype, op});
}

// ---- float32 data over a 16-bit wire (fp16/bf16, round to nearest even) ----
// The wire carries float32 data: SUM, PRODUCT, MIN, MAX (no bitwise ops).
constexpr int kWireOps = static_cast<int>(RedOp::Max) + 1;
struct WireKernels {
  void (*pack)(uint16_t* dst, const float* src, size_t n);
  void (*unpack)(float* dst, const uint16_t* src, size_t n);
  // dst = a op widen(src) (a may be dst): reduceTo-shaped, by RedOp.
  void (*reduce[kWireOps])(void* dst, const void* a, const void* src, size_t n);
  // The same, the sum rounded to the wire's precision as it is stored.
  void (*reduceRound[kWireOps])(void* dst, const void* a, const void* src, size_t n);
};
const WireKernels& wireKernels(Wire w);  // w is F16 or BF16
// Finite float32 values this thread packed to fp16 that became inf
// (|x| >= 65520): counted by the fp16 pack itself, no extra pass.
extern thread_local uint64_t tlsFp16Overflows;

inline void packToWire(void* dst, const float* src, size_t n, Wire w) {
  wireKernels(w).pack(static_cast<uint16_t*>(dst), src, n);
}
inline void unpackFromWire(float* dst, const void* src, size_t n, Wire w) {
  wireKernels(w).unpack(dst, static_cast<const uint16_t*>(src), n);
}
// Rounds float32 values in place to what the wire would deliver.
void roundToWire(float* buf, size_t n, Wire w);
// How reduceFromWire combines: src holds `wire` values, widened and
// combined with `op` into `a`'s values (nullptr: dst's own); the sums are
// then rounded to `roundTo` (F32: not rounded), in the same pass when
// roundTo is the wire itself (a final sum on a compressed link).
struct FromWire {
  Wire wire;
  RedOp op;
  Wire roundTo = Wire::F32;
  const float* a = nullptr;
};
inline void reduceFromWire(float* dst, const void* src, size_t n, const FromWire& how) {
  const int op = static_cast<int>(how.op);
  const float* a = how.a ? how.a : dst;
  if (how.roundTo == how.wire) {
    wireKernels(how.wire).reduceRound[op](dst, a, src, n);
    return;
  }
  wireKernels(how.wire).reduce[op](dst, a, src, n);
  roundToWire(dst, n, how.roundTo);
}

// Which instruction set the dispatcher picked ("avx2+f16c" or "portable").
const char* reduceIsa();

}  // namespace smdccl
