// The same loops compiled with -mavx2 -mf16c -mfma (set in CMakeLists.txt);
// only called after the dispatcher saw those features on this CPU.
#define SMDCCL_REDUCE_NS avx2
#define SMDCCL_REDUCE_AVX2 1
#include "kernels/cpu/reduce_impl.h"

namespace smdccl::avx2 {
ReduceFn lookupAvx2(DType t, RedOp op) { return lookup(t, op); }
ReduceFn streamF32Avx2(RedOp op) { return lookupStreamF32(op); }
::smdccl::WireKernels wireAvx2(bool bf16) { return wireKernels(bf16); }
}  // namespace smdccl::avx2
