// Picks the reduction loops for this CPU once, at first use.
#include "kernels/cpu/reduce.h"

#include <cstdint>

namespace smdccl {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);
namespace portable { ReduceFn lookupPortable(DType t, RedOp op); }
#if defined(SMDCCL_HAVE_AVX2_TU)
namespace avx2 { ReduceFn lookupAvx2(DType t, RedOp op); }
#endif

namespace {

constexpr int kTypes = static_cast<int>(DType::Bool) + 1;
constexpr int kOps = static_cast<int>(RedOp::Max) + 1;

struct Table {
  ReduceFn fn[kTypes][kOps];
  const char* isa;
  Table() {
    bool useAvx2 = false;
#if defined(SMDCCL_HAVE_AVX2_TU)
    __builtin_cpu_init();
    useAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
              __builtin_cpu_supports("fma");
#endif
    isa = useAvx2 ? "avx2+f16c" : "portable";
    for (int t = 0; t < kTypes; ++t)
      for (int o = 0; o < kOps; ++o) {
        auto dt = static_cast<DType>(t);
        auto op = static_cast<RedOp>(o);
#if defined(SMDCCL_HAVE_AVX2_TU)
        fn[t][o] = useAvx2 ? avx2::lookupAvx2(dt, op) : portable::lookupPortable(dt, op);
#else
        fn[t][o] = portable::lookupPortable(dt, op);
#endif
      }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

void reduceTo(void* out, const void* a, const void* b, size_t count, DType dtype, RedOp op) {
  if (count == 0) return;
  table().fn[static_cast<int>(dtype)][static_cast<int>(op)](out, a, b, count);
}

const char* reduceIsa() { return table().isa; }

}  // namespace smdccl
