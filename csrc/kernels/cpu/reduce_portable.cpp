// Baseline build of the reduction loops (any x86-64 / other CPU).
#define SMDCCL_REDUCE_NS portable
#include "kernels/cpu/reduce_impl.h"

namespace smdccl::portable {
ReduceFn lookupPortable(DType t, RedOp op) { return lookup(t, op); }
ReduceFn streamF32Portable(RedOp op) { return lookupStreamF32(op); }
::smdccl::WireKernels wirePortable(bool bf16) { return wireKernels(bf16); }
}  // namespace smdccl::portable
