// Picks the reduction loops for this CPU once, at first use.
#include "kernels/cpu/reduce.h"

#include <unistd.h>

#include <cstdint>
#include <string>

#include "common/error.h"

namespace smdccl {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);
namespace portable {
ReduceFn lookupPortable(DType t, RedOp op);
ReduceFn streamF32Portable(RedOp op);
WireKernels wirePortable(bool bf16);
}  // namespace portable
#if defined(SMDCCL_HAVE_AVX2_TU)
namespace avx2 {
ReduceFn lookupAvx2(DType t, RedOp op);
ReduceFn streamF32Avx2(RedOp op);
WireKernels wireAvx2(bool bf16);
}  // namespace avx2
#endif

namespace {

constexpr int kTypes = static_cast<int>(DType::Bool) + 1;
constexpr int kOps = static_cast<int>(RedOp::BXor) + 1;

struct Table {
  ReduceFn fn[kTypes][kOps];
  ReduceFn f32Stream[kWireOps];  // float32 SUM..MAX, out streamed
  WireKernels wire[2];  // fp16, bf16
  const char* isa;
  Table() {
    bool useAvx2 = false;
#if defined(SMDCCL_HAVE_AVX2_TU)
    __builtin_cpu_init();
    useAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
              __builtin_cpu_supports("fma");
#endif
    isa = useAvx2 ? "avx2+f16c" : "portable";
    for (int o = 0; o < kWireOps; ++o) {
#if defined(SMDCCL_HAVE_AVX2_TU)
      f32Stream[o] = useAvx2 ? avx2::streamF32Avx2(static_cast<RedOp>(o))
                             : portable::streamF32Portable(static_cast<RedOp>(o));
#else
      f32Stream[o] = portable::streamF32Portable(static_cast<RedOp>(o));
#endif
    }
    for (int b = 0; b < 2; ++b) {
#if defined(SMDCCL_HAVE_AVX2_TU)
      wire[b] = useAvx2 ? avx2::wireAvx2(b == 1) : portable::wirePortable(b == 1);
#else
      wire[b] = portable::wirePortable(b == 1);
#endif
    }
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

void reduceTo(void* out, const void* a, const void* b, size_t count, ElementOp e) {
  const DType dtype = e.dtype;
  const RedOp op = e.op;
  if (count == 0) return;
  ReduceFn fn = table().fn[static_cast<int>(dtype)][static_cast<int>(op)];
  // The backend refuses these pairs at the call; a loud error, not a crash,
  // if a path ever forgets to.
  if (fn == nullptr)
    throw InvalidArgument(std::string("no ") + redOpName(op) + " kernel for " + dtypeName(dtype));
  fn(out, a, b, count);
}

void reduceToStreaming(void* out, const void* a, const void* b, size_t count, ElementOp e) {
  const int op = static_cast<int>(e.op);
  if (e.dtype != DType::F32 || op >= kWireOps || count == 0) return reduceTo(out, a, b, count, e);
  table().f32Stream[op](out, a, b, count);
}

size_t streamingOutBytes() {
  static const size_t bytes = [] {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    return llc > 0 ? static_cast<size_t>(llc) / 8 : size_t{4} << 20;
  }();
  return bytes;
}

const char* reduceIsa() { return table().isa; }

thread_local uint64_t tlsFp16Overflows = 0;

const WireKernels& wireKernels(Wire w) { return table().wire[w == Wire::BF16 ? 1 : 0]; }

void roundToWire(float* buf, size_t n, Wire w) {
  if (w == Wire::F32) return;
  const WireKernels& k = wireKernels(w);
  uint16_t tmp[1024];
  for (size_t i = 0; i < n; i += 1024) {
    size_t m = n - i < 1024 ? n - i : 1024;
    k.pack(tmp, buf + i, m);
    k.unpack(buf + i, tmp, m);
  }
}

}  // namespace smdccl
