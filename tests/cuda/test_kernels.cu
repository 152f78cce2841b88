// The CUDA kernels (kernels/cuda/kernels.h) against the CPU kernels
// (kernels/cpu/reduce.h): bit for bit, signed zeros of MIN/MAX included,
// except that a NaN only has to be a NaN (the GPU's arithmetic returns a
// canonical NaN, x86 the operand's payload).
//
// Without a CUDA device the binary prints "no CUDA device" and exits 77 before
// any test runs, so "nothing ran" cannot pass for a pass.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "check.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/kernels.h"

using smdccl::DType;
using smdccl::RedOp;
using smdccl::Wire;
namespace gpu = smdccl::cuda;

namespace {

struct RequireGpu {
  RequireGpu() {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n <= 0) {
      std::printf("no CUDA device\n");
      std::fflush(stdout);
      std::exit(77);
    }
  }
};
const RequireGpu gRequireGpu;

#define CK(expr) CHECK((expr) == cudaSuccess)

constexpr RedOp kAllOps[] = {RedOp::Sum,  RedOp::Prod, RedOp::Min, RedOp::Max,
                             RedOp::BAnd, RedOp::BOr,  RedOp::BXor};

// The ops a dtype's kernels take: the bitwise ones only for integers and bool.
std::vector<RedOp> opsFor(DType t) {
  std::vector<RedOp> ops;
  for (RedOp op : kAllOps)
    if (!smdccl::isBitwise(op) || !smdccl::isFloating(t)) ops.push_back(op);
  return ops;
}

// Device memory with slack for misaligned views.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n + 64) {
    if (cudaMalloc(&p, bytes) != cudaSuccess) p = nullptr;
  }
  ~DevBuf() { cudaFree(p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  unsigned char* at(size_t off) const { return static_cast<unsigned char*>(p) + off; }
};

uint64_t bitsOf(const unsigned char* p, size_t size) {
  uint64_t v = 0;
  std::memcpy(&v, p, size);
  return v;
}

// The NaN test on the raw bits of one element.
bool isNanBits(DType t, uint64_t v) {
  switch (t) {
    case DType::F32: return (v & 0x7fffffffu) > 0x7f800000u;
    case DType::F64: return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case DType::F16: return (v & 0x7fffu) > 0x7c00u;
    case DType::BF16: return (v & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

// Element-wise comparison; prints the first few mismatches.
bool sameElements(const void* got, const void* want, size_t n, DType t, const char* what) {
  size_t es = smdccl::elementSize(t);
  const auto* g = static_cast<const unsigned char*>(got);
  const auto* w = static_cast<const unsigned char*>(want);
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint64_t a = bitsOf(g + i * es, es), b = bitsOf(w + i * es, es);
    if (a == b) continue;
    if (isNanBits(t, a) && isNanBits(t, b)) continue;
    if (bad++ < 5)
      std::fprintf(stderr, "  %s: %s element %zu of %zu: got 0x%llx want 0x%llx\n", what,
                   smdccl::dtypeName(t), i, n, static_cast<unsigned long long>(a),
                   static_cast<unsigned long long>(b));
  }
  return bad == 0;
}

// Values that exercise the type: moderate magnitudes (sums that round),
// random bit patterns (NaN, inf, subnormals, huge), signed zeros, wrapping
// integers, 0/1 bools.
std::vector<unsigned char> randomData(DType t, size_t n, std::mt19937_64& rng) {
  size_t es = smdccl::elementSize(t);
  std::vector<unsigned char> v(n * es + 16);
  for (size_t i = 0; i < n; ++i) {
    uint64_t r = rng();
    unsigned pick = static_cast<unsigned>(r >> 56);  // 0..255
    uint64_t bits = 0;
    switch (t) {
      case DType::F32: {
        if (pick < 200) {  // sign, exponent 2^-3..2^4, random mantissa
          uint32_t e = 124 + static_cast<uint32_t>((r >> 40) % 8);
          bits = ((r & 1) << 31) | (uint64_t(e) << 23) | ((r >> 8) & 0x7fffff);
        } else if (pick < 240) {
          bits = r & 0xffffffffu;
        } else if (pick < 244) {
          bits = 0x7fc00000u | (r & 0x3fffff) | ((r & 2) << 30);  // NaN
        } else if (pick < 248) {
          bits = (r & 1) ? 0x80000000u : 0;  // +-0
        } else if (pick < 252) {
          bits = (r & 1) ? 0xff800000u : 0x7f800000u;  // +-inf
        } else {
          bits = 0x7f7fffffu | ((r & 1) << 31);  // +-FLT_MAX
        }
        break;
      }
      case DType::F64: {
        if (pick < 200) {
          uint64_t e = 1020 + (r >> 40) % 8;
          bits = ((r & 1) << 63) | (e << 52) | ((r >> 4) & 0xfffffffffffffull);
        } else if (pick < 240) {
          bits = r;
        } else if (pick < 244) {
          bits = 0x7ff8000000000000ull | (r & 0xffffffffull);
        } else if (pick < 248) {
          bits = (r & 1) ? 0x8000000000000000ull : 0;
        } else {
          bits = (r & 1) ? 0xfff0000000000000ull : 0x7ff0000000000000ull;
        }
        break;
      }
      case DType::F16: {
        if (pick < 200) {
          uint64_t e = 13 + (r >> 40) % 5;
          bits = ((r & 1) << 15) | (e << 10) | ((r >> 8) & 0x3ff);
        } else if (pick < 248) {
          bits = r & 0xffff;  // anything: subnormals, inf, NaN, 65504
        } else {
          bits = (r & 1) ? 0x8000 : 0;
        }
        break;
      }
      case DType::BF16: {
        if (pick < 200) {
          uint64_t e = 124 + (r >> 40) % 8;
          bits = ((r & 1) << 15) | (e << 7) | ((r >> 8) & 0x7f);
        } else if (pick < 248) {
          bits = r & 0xffff;
        } else {
          bits = (r & 1) ? 0x8000 : 0;
        }
        break;
      }
      case DType::Bool: bits = r & 1; break;
      default:
        // Small values (products that do not wrap at once) and any bits (wrap).
        bits = pick < 128 ? static_cast<uint64_t>(static_cast<int64_t>(r % 11) - 5) : r;
        break;
    }
    std::memcpy(v.data() + i * es, &bits, es);
  }
  return v;
}

// ---------------------------------------------------------------- two inputs

// out = a op b: reduceMulti with two inputs (the reduce of a two-rank node).
cudaError_t reduce2(void* out, const void* a, const void* b, const gpu::Elementwise& e,
                    cudaStream_t stream) {
  const void* in[2] = {a, b};
  return gpu::reduceMulti(out, in, 2, e, stream);
}

// One reduce2 case. layout: 0 aligned; 1 every pointer one element past
// 16-byte alignment; 2 only b misaligned; 3 out aliases a.
void checkReduce2(DType t, RedOp op, size_t n, int layout, std::mt19937_64& rng) {
  size_t es = smdccl::elementSize(t);
  size_t bytes = n * es;
  auto a = randomData(t, n, rng), b = randomData(t, n, rng);
  std::vector<unsigned char> want(bytes + 16), got(bytes + 16);
  smdccl::reduceTo(want.data(), a.data(), b.data(), n, {t, op});

  DevBuf da(bytes), db(bytes), dout(bytes);
  CHECK(da.p && db.p && dout.p);
  if (!da.p || !db.p || !dout.p) return;
  size_t offA = layout == 1 ? es : 0, offB = (layout == 1 || layout == 2) ? es : 0;
  size_t offO = layout == 1 ? es : 0;
  unsigned char* pa = da.at(offA);
  unsigned char* pb = db.at(offB);
  unsigned char* po = layout == 3 ? pa : dout.at(offO);
  CK(cudaMemcpy(pa, a.data(), bytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(pb, b.data(), bytes, cudaMemcpyHostToDevice));
  if (layout != 3) CK(cudaMemset(dout.p, 0xA5, dout.bytes));
  CK(reduce2(po, pa, pb, {n, t, op}, nullptr));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got.data(), po, bytes, cudaMemcpyDeviceToHost));
  char what[96];
  std::snprintf(what, sizeof what, "reduce2 %s n=%zu layout=%d", smdccl::redOpName(op), n, layout);
  CHECK(sameElements(got.data(), want.data(), n, t, what));
  if (layout != 3 && n > 0) {  // nothing written past the end
    unsigned char after[16];
    CK(cudaMemcpy(after, po + bytes, 16, cudaMemcpyDeviceToHost));
    bool untouched = true;
    for (unsigned char c : after) untouched = untouched && c == 0xA5;
    CHECK(untouched);
  }
}

const size_t kSizes[] = {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 1000, (size_t(1) << 20) + 3};

void reduce2Type(DType t) {
  std::mt19937_64 rng(1234 + static_cast<int>(t));
  for (RedOp op : opsFor(t))
    for (size_t n : kSizes)
      for (int layout = 0; layout < 4; ++layout) {
        if (n > 100000 && layout == 2) continue;
        checkReduce2(t, op, n, layout, rng);
      }
}

TEST(cuda_reduce2_f32) { reduce2Type(DType::F32); }
TEST(cuda_reduce2_f64) { reduce2Type(DType::F64); }
TEST(cuda_reduce2_f16) { reduce2Type(DType::F16); }
TEST(cuda_reduce2_bf16) { reduce2Type(DType::BF16); }
TEST(cuda_reduce2_i8) { reduce2Type(DType::I8); }
TEST(cuda_reduce2_i32) { reduce2Type(DType::I32); }
TEST(cuda_reduce2_i64) { reduce2Type(DType::I64); }
TEST(cuda_reduce2_u8) { reduce2Type(DType::U8); }
TEST(cuda_reduce2_bool) { reduce2Type(DType::Bool); }

// Hand-picked cases whose CPU results are known.
TEST(cuda_reduce2_known_values) {
  {  // int32 wraps
    int32_t a[3] = {INT32_MAX, INT32_MIN, 65536}, b[3] = {1, -1, 65536}, got[3];
    DevBuf da(12), db(12), dout(12);
    CK(cudaMemcpy(da.p, a, 12, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p, b, 12, cudaMemcpyHostToDevice));
    CK(reduce2(dout.p, da.p, db.p, {3, DType::I32, RedOp::Sum}, nullptr));
    CK(cudaMemcpy(got, dout.p, 12, cudaMemcpyDeviceToHost));
    CHECK(got[0] == INT32_MIN && got[1] == INT32_MAX && got[2] == 131072);
    CK(reduce2(dout.p, da.p, db.p, {3, DType::I32, RedOp::Prod}, nullptr));
    CK(cudaMemcpy(got, dout.p, 12, cudaMemcpyDeviceToHost));
    CHECK(got[0] == INT32_MAX && got[1] == INT32_MIN && got[2] == 0);
  }
  {  // float MIN/MAX: NaN wins on either side
    float a[4] = {1.0f, NAN, -2.0f, 3.0f}, b[4] = {NAN, 1.0f, -3.0f, 4.0f}, got[4];
    DevBuf da(16), db(16), dout(16);
    CK(cudaMemcpy(da.p, a, 16, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p, b, 16, cudaMemcpyHostToDevice));
    CK(reduce2(dout.p, da.p, db.p, {4, DType::F32, RedOp::Min}, nullptr));
    CK(cudaMemcpy(got, dout.p, 16, cudaMemcpyDeviceToHost));
    CHECK(std::isnan(got[0]) && std::isnan(got[1]) && got[2] == -3.0f && got[3] == 3.0f);
    CK(reduce2(dout.p, da.p, db.p, {4, DType::F32, RedOp::Max}, nullptr));
    CK(cudaMemcpy(got, dout.p, 16, cudaMemcpyDeviceToHost));
    CHECK(std::isnan(got[0]) && std::isnan(got[1]) && got[2] == -2.0f && got[3] == 4.0f);
  }
  {  // bool: SUM/MAX/BOR = OR, PROD/MIN/BAND = AND, BXOR = XOR
    uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, got[4];
    DevBuf da(4), db(4), dout(4);
    CK(cudaMemcpy(da.p, a, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p, b, 4, cudaMemcpyHostToDevice));
    for (RedOp op : kAllOps) {
      CK(reduce2(dout.p, da.p, db.p, {4, DType::Bool, op}, nullptr));
      CK(cudaMemcpy(got, dout.p, 4, cudaMemcpyDeviceToHost));
      bool orLike = op == RedOp::Sum || op == RedOp::Max || op == RedOp::BOr;
      uint8_t both = op == RedOp::BXor ? 0 : 1;
      CHECK(got[0] == 0 && got[1] == (orLike || op == RedOp::BXor ? 1 : 0) &&
            got[2] == (orLike || op == RedOp::BXor ? 1 : 0) && got[3] == both);
    }
  }
  {  // int8 bitwise ops on the bits, sign included
    int8_t a[3] = {-1, 0x5a, -128}, b[3] = {0x0f, 0x3c, 0x7f}, got[3];
    DevBuf da(3), db(3), dout(3);
    CK(cudaMemcpy(da.p, a, 3, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p, b, 3, cudaMemcpyHostToDevice));
    CK(reduce2(dout.p, da.p, db.p, {3, DType::I8, RedOp::BAnd}, nullptr));
    CK(cudaMemcpy(got, dout.p, 3, cudaMemcpyDeviceToHost));
    CHECK(got[0] == 0x0f && got[1] == 0x18 && got[2] == 0);
    CK(reduce2(dout.p, da.p, db.p, {3, DType::I8, RedOp::BXor}, nullptr));
    CK(cudaMemcpy(got, dout.p, 3, cudaMemcpyDeviceToHost));
    CHECK(got[0] == static_cast<int8_t>(0xf0) && got[1] == 0x66 && got[2] == -1);
  }
  {  // bitwise ops on floats: refused, nothing launched
    DevBuf da(16), db(16), dout(16);
    for (RedOp op : {RedOp::BAnd, RedOp::BOr, RedOp::BXor}) {
      CHECK(reduce2(dout.p, da.p, db.p, {4, DType::F32, op}, nullptr) ==
            cudaErrorInvalidValue);
      cudaGetLastError();
    }
  }
  {  // bf16: 1 + 2^-8 rounds to even (1), 1 + 3*2^-8 rounds up (1 + 2^-6)
    uint16_t a[2] = {0x3f80, 0x3f80}, b[2] = {0x3b80, 0x3c40}, got[2];  // 1; 2^-8, 3*2^-8
    DevBuf da(4), db(4), dout(4);
    CK(cudaMemcpy(da.p, a, 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db.p, b, 4, cudaMemcpyHostToDevice));
    CK(reduce2(dout.p, da.p, db.p, {2, DType::BF16, RedOp::Sum}, nullptr));
    CK(cudaMemcpy(got, dout.p, 4, cudaMemcpyDeviceToHost));
    CHECK(got[0] == 0x3f80 && got[1] == 0x3f82);
  }
}

TEST(cuda_zero_count_and_bad_arguments) {
  CK(reduce2(nullptr, nullptr, nullptr, {0, DType::F32, RedOp::Sum}, nullptr));
  const void* none[1] = {nullptr};
  CK(gpu::reduceMulti(nullptr, none, 1, {0, DType::F32, RedOp::Sum}, nullptr));
  CHECK(gpu::reduceMulti(nullptr, none, 0, {10, DType::F32, RedOp::Sum}, nullptr) ==
        cudaErrorInvalidValue);
  CHECK(gpu::reduceMulti(nullptr, none, gpu::kMaxReduceInputs + 1, {10, DType::F32, RedOp::Sum},
                         nullptr) == cudaErrorInvalidValue);
  CK(gpu::packToWire(nullptr, nullptr, 0, {Wire::F16, nullptr}, nullptr));
  CK(gpu::unpackFromWire(nullptr, nullptr, 0, Wire::BF16, nullptr));
  CHECK(gpu::packToWire(nullptr, nullptr, 4, {Wire::F32, nullptr}, nullptr) ==
        cudaErrorInvalidValue);
  CK(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------- reduceMulti

// The documented accumulation, with the CPU kernels: in order 0..k-1 in the
// accumulation type (float32 for 16-bit types, rounded once at the end).
std::vector<unsigned char> multiReference(const std::vector<std::vector<unsigned char>>& in,
                                          size_t n, DType t, RedOp op) {
  size_t es = smdccl::elementSize(t);
  std::vector<unsigned char> out(n * es + 16);
  if (t == DType::F16 || t == DType::BF16) {
    Wire w = t == DType::F16 ? Wire::F16 : Wire::BF16;
    std::vector<float> acc(n + 1), x(n + 1);
    smdccl::unpackFromWire(acc.data(), in[0].data(), n, w);
    for (size_t j = 1; j < in.size(); ++j) {
      smdccl::unpackFromWire(x.data(), in[j].data(), n, w);
      smdccl::reduceTo(acc.data(), acc.data(), x.data(), n, {DType::F32, op});
    }
    smdccl::packToWire(out.data(), acc.data(), n, w);
  } else {
    std::memcpy(out.data(), in[0].data(), n * es);
    for (size_t j = 1; j < in.size(); ++j)
      smdccl::reduceTo(out.data(), out.data(), in[j].data(), n, {t, op});
  }
  return out;
}

// alias: -1 none, else out is input `alias`; misalign: every pointer one
// element past alignment.
void checkMulti(DType t, RedOp op, int k, size_t n, int alias, bool misalign,
                std::mt19937_64& rng) {
  size_t es = smdccl::elementSize(t);
  size_t bytes = n * es;
  size_t off = misalign ? es : 0;
  std::vector<std::vector<unsigned char>> host;
  std::vector<DevBuf*> bufs;
  std::vector<const void*> ptrs;
  for (int j = 0; j < k; ++j) {
    host.push_back(randomData(t, n, rng));
    bufs.push_back(new DevBuf(bytes));
    CK(cudaMemcpy(bufs.back()->at(off), host.back().data(), bytes, cudaMemcpyHostToDevice));
    ptrs.push_back(bufs.back()->at(off));
  }
  auto want = multiReference(host, n, t, op);
  DevBuf dout(bytes);
  void* out = alias >= 0 ? const_cast<void*>(ptrs[alias]) : dout.at(off);
  CK(gpu::reduceMulti(out, ptrs.data(), k, {n, t, op}, nullptr));
  CK(cudaDeviceSynchronize());
  std::vector<unsigned char> got(bytes + 16);
  CK(cudaMemcpy(got.data(), out, bytes, cudaMemcpyDeviceToHost));
  char what[128];
  std::snprintf(what, sizeof what, "reduceMulti %s k=%d n=%zu alias=%d misalign=%d",
                smdccl::redOpName(op), k, n, alias, misalign ? 1 : 0);
  CHECK(sameElements(got.data(), want.data(), n, t, what));
  for (DevBuf* b : bufs) delete b;
}

void multiType(DType t) {
  std::mt19937_64 rng(777 + static_cast<int>(t));
  const size_t sizes[] = {1, 9, 33, 1000, (size_t(1) << 18) + 5};
  for (RedOp op : opsFor(t))
    for (int k : {1, 2, 3, 4, 8, 16})
      for (size_t n : sizes) {
        checkMulti(t, op, k, n, -1, false, rng);
        if (n == 1000) {
          checkMulti(t, op, k, n, k - 1, false, rng);
          checkMulti(t, op, k, n, 0, true, rng);
          checkMulti(t, op, k, n, -1, true, rng);
        }
      }
}

TEST(cuda_reduce_multi_f32) { multiType(DType::F32); }
TEST(cuda_reduce_multi_f64) { multiType(DType::F64); }
TEST(cuda_reduce_multi_f16) { multiType(DType::F16); }
TEST(cuda_reduce_multi_bf16) { multiType(DType::BF16); }
TEST(cuda_reduce_multi_ints_and_bool) {
  for (DType t : {DType::I8, DType::I32, DType::I64, DType::U8, DType::Bool}) multiType(t);
}

// 16-bit: accumulated in float32 and rounded once, which is not repeated
// reduce2 (each step rounded). bf16, ulp(1) = 2^-7: 1 + 0.625 ulp + 0.625 ulp
// is 1 + 1.25 ulp -> 1 + 1 ulp in one rounding, but 1 + 1 ulp, then
// 1 + 1.625 ulp -> 1 + 2 ulp step by step.
TEST(cuda_reduce_multi_rounds_once) {
  uint16_t x[3] = {0x3f80, 0x3ba0, 0x3ba0};  // 1, 1.25 * 2^-8, 1.25 * 2^-8
  DevBuf d0(2), d1(2), d2(2), dout(2);
  CK(cudaMemcpy(d0.p, &x[0], 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d1.p, &x[1], 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(d2.p, &x[2], 2, cudaMemcpyHostToDevice));
  const void* in[3] = {d0.p, d1.p, d2.p};
  uint16_t got = 0;
  CK(gpu::reduceMulti(dout.p, in, 3, {1, DType::BF16, RedOp::Sum}, nullptr));
  CK(cudaMemcpy(&got, dout.p, 2, cudaMemcpyDeviceToHost));
  CHECK(got == 0x3f81);
  CK(reduce2(dout.p, d0.p, d1.p, {1, DType::BF16, RedOp::Sum}, nullptr));
  CK(reduce2(dout.p, dout.p, d2.p, {1, DType::BF16, RedOp::Sum}, nullptr));
  CK(cudaMemcpy(&got, dout.p, 2, cudaMemcpyDeviceToHost));
  CHECK(got == 0x3f82);
}

// ---------------------------------------------------------------- wire

std::vector<float> wireFloats(size_t n, std::mt19937_64& rng) {
  std::vector<float> v(n + 4);
  std::normal_distribution<float> nd(0.0f, 100.0f);
  for (size_t i = 0; i < n; ++i) {
    unsigned pick = static_cast<unsigned>(rng() % 64);
    float f;
    if (pick < 48) f = nd(rng);
    else if (pick == 48) f = 65519.0f;  // rounds to 65504: not an overflow
    else if (pick == 49) f = 65520.0f;  // rounds to inf: overflow
    else if (pick == 50) f = -1e6f;     // overflow
    else if (pick == 51) f = INFINITY;  // already inf: not counted
    else if (pick == 52) f = -NAN;
    else if (pick == 53) f = 3.4028235e38f;  // overflow in fp16; bf16 rounds to inf
    else if (pick == 54) f = 1e-8f;          // fp16 subnormal / zero
    else if (pick == 55) f = -0.0f;
    else {
      uint32_t u = static_cast<uint32_t>(rng());
      std::memcpy(&f, &u, 4);  // any bits
    }
    v[i] = f;
  }
  return v;
}

uint64_t countOverflows(const float* x, size_t n) {
  uint64_t c = 0;
  for (size_t i = 0; i < n; ++i) {
    float a = std::fabs(x[i]);
    c += a >= 65520.0f && a <= 3.4028235e38f;
  }
  return c;
}

void checkWire(Wire w, size_t n, size_t off, std::mt19937_64& rng) {
  DType t16 = w == Wire::F16 ? DType::F16 : DType::BF16;
  char what[96];
  auto src = wireFloats(n, rng);
  // pack
  std::vector<uint16_t> want16(n + 8), got16(n + 8);
  uint64_t before = smdccl::tlsFp16Overflows;
  smdccl::packToWire(want16.data(), src.data(), n, w);
  uint64_t cpuDelta = smdccl::tlsFp16Overflows - before;
  DevBuf dsrc(n * 4), d16(n * 2), ddst(n * 4), dcount(8);
  float* psrc = reinterpret_cast<float*>(dsrc.at(off * 4));
  uint16_t* p16 = reinterpret_cast<uint16_t*>(d16.at(off * 2));
  float* pdst = reinterpret_cast<float*>(ddst.at(off * 4));
  auto* pcount = static_cast<unsigned long long*>(dcount.p);
  CK(cudaMemcpy(psrc, src.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(pcount, 0, 8));
  CK(gpu::packToWire(p16, psrc, n, {w, pcount}, nullptr));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(got16.data(), p16, n * 2, cudaMemcpyDeviceToHost));
  std::snprintf(what, sizeof what, "packToWire %s n=%zu off=%zu", smdccl::wireName(w), n, off);
  CHECK(sameElements(got16.data(), want16.data(), n, t16, what));
  unsigned long long gpuCount = 0;
  CK(cudaMemcpy(&gpuCount, pcount, 8, cudaMemcpyDeviceToHost));
  if (w == Wire::F16) {
    CHECK(gpuCount == countOverflows(src.data(), n));
    CHECK((gpuCount > 0) == (cpuDelta > 0));  // the CPU counts packs with overflows
  } else {
    CHECK(gpuCount == 0);
  }
  CK(gpu::packToWire(p16, psrc, n, {w, nullptr}, nullptr));  // no counter
  CK(cudaDeviceSynchronize());

  // unpack: any 16-bit pattern
  std::vector<uint16_t> bits(n + 8);
  for (size_t i = 0; i < n; ++i) bits[i] = static_cast<uint16_t>(rng());
  std::vector<float> wantF(n + 4), gotF(n + 4);
  smdccl::unpackFromWire(wantF.data(), bits.data(), n, w);
  CK(cudaMemcpy(p16, bits.data(), n * 2, cudaMemcpyHostToDevice));
  CK(gpu::unpackFromWire(pdst, p16, n, w, nullptr));
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(gotF.data(), pdst, n * 4, cudaMemcpyDeviceToHost));
  std::snprintf(what, sizeof what, "unpackFromWire %s n=%zu off=%zu", smdccl::wireName(w), n, off);
  CHECK(sameElements(gotF.data(), wantF.data(), n, DType::F32, what));
}

TEST(cuda_wire) {
  std::mt19937_64 rng(99);
  for (Wire w : {Wire::F16, Wire::BF16})
    for (size_t n : kSizes)
      for (size_t off : {size_t(0), size_t(1)}) checkWire(w, n, off, rng);
}

// Many blocks with overflows: the per-block counts add up.
TEST(cuda_wire_overflow_count_many_blocks) {
  size_t n = (size_t(1) << 22) + 5;
  std::vector<float> src(n, 1.0f);
  size_t expected = 0;
  for (size_t i = 0; i < n; i += 97) {
    src[i] = (i & 1) ? 70000.0f : -65520.0f;
    ++expected;
  }
  src[n - 1] = 1e30f;
  ++expected;
  DevBuf dsrc(n * 4), d16(n * 2), dcount(8);
  CK(cudaMemcpy(dsrc.p, src.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(dcount.p, 0, 8));
  auto* pc = static_cast<unsigned long long*>(dcount.p);
  CK(gpu::packToWire(d16.p, static_cast<float*>(dsrc.p), n, {Wire::F16, pc}, nullptr));
  CK(gpu::packToWire(d16.p, static_cast<float*>(dsrc.p), n, {Wire::F16, pc}, nullptr));
  unsigned long long got = 0;
  CK(cudaMemcpy(&got, pc, 8, cudaMemcpyDeviceToHost));
  CHECK(got == 2 * expected);
}

}  // namespace

// Every kernel loads ahead of its first launch (what a GPU context does
// before it queues any stream wait), and launches work after it.
TEST(cuda_preload_kernels_loads_every_kernel) {
  CHECK(smdccl::cuda::preloadKernels() == cudaSuccess);
  CHECK(cudaGetLastError() == cudaSuccess);
  reduce2Type(DType::F32);
}

// ---------------------------------------------------------------- int8 wire

// quantizeInt8 / dequantizeAddInt8 / dequantizeInt8 give the CPU's bytes
// and floats: sizes around the block, a piece at an odd address, blocks of
// zeros, of inf, of NaN and too small for a step, among normal and
// heavy-tailed values.
TEST(cuda_int8_wire_matches_the_cpu) {
  std::mt19937_64 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t n : {size_t{1}, size_t{31}, size_t{127}, size_t{128}, size_t{129}, size_t{1000},
                   size_t{65537}}) {
    std::vector<float> x(n), a(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = normal(rng) * std::exp(normal(rng));
      a[i] = normal(rng);
    }
    if (n > 600) {
      for (size_t i = 128; i < 256; ++i) x[i] = 0.0f;
      x[300] = INFINITY;
      x[520] = NAN;
      // A block too small for 127 / m (sent as zeros), with zeros in it.
      for (size_t i = 384; i < 512; ++i) x[i] = i % 3 ? 0.0f : (i % 2 ? -1e-38f : 3e-39f);
    }
    const size_t bytes = smdccl::int8Bytes(n);
    std::vector<unsigned char> want(bytes), got(bytes);
    smdccl::quantizeInt8(want.data(), x.data(), n);
    std::vector<float> wantAdd(n), wantDec(n), gotAdd(n), gotDec(n);
    smdccl::dequantizeAddInt8(wantAdd.data(), a.data(), want.data(), n);
    smdccl::dequantizeInt8(wantDec.data(), want.data(), n);

    DevBuf dx(n * 4), da(n * 4), dq(bytes + 1), dadd(n * 4), ddec(n * 4);
    CK(cudaMemcpy(dx.p, x.data(), n * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(da.p, a.data(), n * 4, cudaMemcpyHostToDevice));
    unsigned char* q = dq.at(1);  // scales at an odd address
    CK(gpu::quantizeInt8(q, static_cast<const float*>(dx.p), n, nullptr));
    CK(gpu::dequantizeAddInt8(static_cast<float*>(dadd.p), static_cast<const float*>(da.p), q, n,
                              nullptr));
    CK(gpu::dequantizeInt8(static_cast<float*>(ddec.p), q, n, nullptr));
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(got.data(), q, bytes, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gotAdd.data(), dadd.p, n * 4, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(gotDec.data(), ddec.p, n * 4, cudaMemcpyDeviceToHost));
    // Bytes equal, but a NaN scale only has to be a NaN.
    const size_t scales = (n + smdccl::kInt8Block - 1) / smdccl::kInt8Block;
    bool same = std::memcmp(got.data() + scales * 4, want.data() + scales * 4, n) == 0;
    for (size_t b = 0; b < scales; ++b) {
      float g, w;
      std::memcpy(&g, got.data() + 4 * b, 4);
      std::memcpy(&w, want.data() + 4 * b, 4);
      same = same && (std::memcmp(&g, &w, 4) == 0 || (std::isnan(g) && std::isnan(w)));
    }
    for (size_t i = 0; i < n; ++i) {
      same = same && (gotAdd[i] == wantAdd[i] || (std::isnan(gotAdd[i]) && std::isnan(wantAdd[i])));
      same = same && (gotDec[i] == wantDec[i] || (std::isnan(gotDec[i]) && std::isnan(wantDec[i])));
    }
    char what[64];
    std::snprintf(what, sizeof what, "int8 wire n=%zu", n);
    if (!same) std::fprintf(stderr, "  %s: GPU differs from the CPU\n", what);
    CHECK(same);
  }
}
