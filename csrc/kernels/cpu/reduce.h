#pragma once
// Elementwise reductions on host memory: out[i] = a[i] op b[i] (out may alias
// a). float16/bfloat16 are widened to float32 for the arithmetic and rounded
// once (round-to-nearest-even). Integer SUM/PRODUCT wrap like torch's. MIN/MAX
// propagate NaN. bool: SUM/MAX are OR, PRODUCT/MIN are AND.
#include <cstddef>

#include "common/dtype.h"

namespace smdccl {

void reduceTo(void* out, const void* a, const void* b, size_t count, DType dtype, RedOp op);

inline void reduceInto(void* dst, const void* src, size_t count, DType dtype, RedOp op) {
  reduceTo(dst, dst, src, count, dtype, op);
}

// Which instruction set the dispatcher picked ("avx2+f16c" or "portable").
const char* reduceIsa();

}  // namespace smdccl
