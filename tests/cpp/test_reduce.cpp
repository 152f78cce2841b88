#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "algorithms/comm.h"
#include "check.h"
#include "common/error.h"
#include "kernels/cpu/reduce.h"

using namespace smdccl;

namespace {
uint16_t toBf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float fromBf16(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace

TEST(reduce_float_ops_and_nan) {
  // Lengths around the vector width exercise the loop tails.
  for (size_t n : {0, 1, 7, 8, 9, 33, 1000}) {
    std::vector<float> a(n), b(n), out(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(i) - 3.5f;
      b[i] = 2.0f - static_cast<float>(i % 5);
    }
    reduceTo(out.data(), a.data(), b.data(), n, {DType::F32, RedOp::Sum});
    for (size_t i = 0; i < n; ++i) CHECK(out[i] == a[i] + b[i]);
    reduceTo(out.data(), a.data(), b.data(), n, {DType::F32, RedOp::Max});
    for (size_t i = 0; i < n; ++i) CHECK(out[i] == std::max(a[i], b[i]));
    reduceTo(out.data(), a.data(), b.data(), n, {DType::F32, RedOp::Prod});
    for (size_t i = 0; i < n; ++i) CHECK(out[i] == a[i] * b[i]);
  }
  double x[2] = {1.0, std::nan("")}, y[2] = {std::nan(""), 2.0}, o[2];
  reduceTo(o, x, y, 2, {DType::F64, RedOp::Min});
  CHECK(std::isnan(o[0]) && std::isnan(o[1]));
}

// MIN/MAX of +0 and -0 as torch.minimum/maximum (-0 below +0), in either
// operand order, in the vector lanes and the scalar tail alike, for every
// floating dtype and the streaming form: ranks that reduce the same values
// in another order must agree bit for bit (vminps alone gave +0 for
// min(-0, +0) in its lanes, the tail -0).
TEST(reduce_min_max_of_signed_zeros_in_either_order) {
  const uint16_t bfPlus = 0, bfMinus = 0x8000;  // bf16 and f16 zeros alike
  for (size_t n : {1, 7, 8, 9, 17, 40}) {
    for (int flip = 0; flip < 2; ++flip) {
      std::vector<float> a(n), b(n), out(n + 8);
      std::vector<double> da(n), db(n), dout(n);
      std::vector<uint16_t> ha(n), hb(n), hout(n);
      for (size_t i = 0; i < n; ++i) {
        const bool neg = (i + static_cast<size_t>(flip)) % 2 == 0;  // -0 in a, then in b
        a[i] = neg ? -0.0f : 0.0f;
        b[i] = neg ? 0.0f : -0.0f;
        da[i] = a[i];
        db[i] = b[i];
        ha[i] = neg ? bfMinus : bfPlus;
        hb[i] = neg ? bfPlus : bfMinus;
      }
      for (RedOp op : {RedOp::Min, RedOp::Max}) {
        const bool wantNeg = op == RedOp::Min;
        for (size_t shift : {0, 1, 3}) {
          reduceTo(out.data() + shift, a.data(), b.data(), n, {DType::F32, op});
          for (size_t i = 0; i < n; ++i)
            CHECK(out[shift + i] == 0.0f && std::signbit(out[shift + i]) == wantNeg);
          reduceToStreaming(out.data() + shift, a.data(), b.data(), n, {DType::F32, op});
          for (size_t i = 0; i < n; ++i) CHECK(std::signbit(out[shift + i]) == wantNeg);
        }
        reduceTo(dout.data(), da.data(), db.data(), n, {DType::F64, op});
        for (size_t i = 0; i < n; ++i) CHECK(dout[i] == 0.0 && std::signbit(dout[i]) == wantNeg);
        for (DType dt : {DType::BF16, DType::F16}) {
          reduceTo(hout.data(), ha.data(), hb.data(), n, {dt, op});
          for (size_t i = 0; i < n; ++i) CHECK(hout[i] == (wantNeg ? bfMinus : bfPlus));
        }
      }
    }
  }
}

TEST(reduce_integers_wrap) {
  int8_t a[3] = {127, -128, 5}, b[3] = {1, -1, -7};
  reduceInto(a, b, 3, DType::I8, RedOp::Sum);
  CHECK(a[0] == -128 && a[1] == 127 && a[2] == -2);
  int64_t c[2] = {std::numeric_limits<int64_t>::max(), 3}, d[2] = {1, -4};
  reduceInto(c, d, 2, DType::I64, RedOp::Min);
  CHECK(c[0] == 1 && c[1] == -4);
  uint8_t e[2] = {200, 3}, f[2] = {100, 4};
  reduceInto(e, f, 2, DType::U8, RedOp::Sum);
  CHECK(e[0] == 44 && e[1] == 7);
}

TEST(reduce_bool_is_logical) {
  uint8_t a[4] = {0, 0, 1, 1}, b[4] = {0, 1, 0, 1}, o[4];
  reduceTo(o, a, b, 4, {DType::Bool, RedOp::Sum});
  CHECK(o[0] == 0 && o[1] == 1 && o[2] == 1 && o[3] == 1);
  reduceTo(o, a, b, 4, {DType::Bool, RedOp::Prod});
  CHECK(o[0] == 0 && o[1] == 0 && o[2] == 0 && o[3] == 1);
}

TEST(reduce_bitwise_ops) {
  int8_t a[3] = {-1, 0x5a, -128}, b[3] = {0x0f, 0x3c, 0x7f}, o[3];
  reduceTo(o, a, b, 3, {DType::I8, RedOp::BAnd});
  CHECK(o[0] == 0x0f && o[1] == 0x18 && o[2] == 0);
  reduceTo(o, a, b, 3, {DType::I8, RedOp::BOr});
  CHECK(o[0] == -1 && o[1] == 0x7e && o[2] == -1);
  reduceTo(o, a, b, 3, {DType::I8, RedOp::BXor});
  CHECK(o[0] == static_cast<int8_t>(0xf0) && o[1] == 0x66 && o[2] == -1);
  int64_t c[2] = {std::numeric_limits<int64_t>::min(), 0x00ff00ff00ff00ffLL},
          d[2] = {-1, 0x0ff00ff00ff00ff0LL};
  reduceInto(c, d, 2, DType::I64, RedOp::BXor);
  CHECK(c[0] == std::numeric_limits<int64_t>::max() && c[1] == 0x0f0f0f0f0f0f0f0fLL);
  // bool: logical, on any nonzero byte, results 0/1
  uint8_t x[4] = {0, 0, 2, 1}, y[4] = {0, 7, 0, 1}, r[4];
  reduceTo(r, x, y, 4, {DType::Bool, RedOp::BAnd});
  CHECK(r[0] == 0 && r[1] == 0 && r[2] == 0 && r[3] == 1);
  reduceTo(r, x, y, 4, {DType::Bool, RedOp::BOr});
  CHECK(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 1);
  reduceTo(r, x, y, 4, {DType::Bool, RedOp::BXor});
  CHECK(r[0] == 0 && r[1] == 1 && r[2] == 1 && r[3] == 0);
  // No bitwise kernel for floating types: an error, never a call through null.
  float f[2] = {1.f, 2.f};
  bool threw = false;
  try {
    reduceInto(f, f, 2, DType::F32, RedOp::BOr);
  } catch (const InvalidArgument&) { threw = true; }
  CHECK(threw);
}

TEST(reduce_bf16_accumulates_in_float32) {
  // 256 + 1 is not representable in bf16 (8 bits of mantissa); the sum is
  // computed in float32 and rounded once to nearest even -> 256.
  uint16_t a[2] = {toBf16(256.f), toBf16(1.5f)}, b[2] = {toBf16(1.f), toBf16(2.25f)};
  reduceInto(a, b, 2, DType::BF16, RedOp::Sum);
  CHECK(fromBf16(a[0]) == 256.f);
  CHECK(fromBf16(a[1]) == 3.75f);
}

TEST(reduce_f16_sum) {
  _Float16 a[9], b[9];
  for (int i = 0; i < 9; ++i) {
    a[i] = static_cast<_Float16>(i * 0.5f);
    b[i] = static_cast<_Float16>(1000.0f);
  }
  reduceInto(a, b, 9, DType::F16, RedOp::Sum);
  for (int i = 0; i < 9; ++i)
    CHECK(static_cast<float>(a[i]) ==
          static_cast<float>(static_cast<_Float16>(1000.0f + i * 0.5f)));
}

TEST(blocks_even_split) {
  Blocks b = Blocks::even(10, 4, 4);
  CHECK((b.length == std::vector<size_t>{12, 12, 8, 8}));
  CHECK((b.offset == std::vector<size_t>{0, 12, 24, 32}));
  CHECK(b.total() == 40);
  Blocks z = Blocks::even(0, 3, 8);
  CHECK(z.total() == 0 && z.offset.size() == 3);
}

TEST(reduce_16bit_vector_and_tail_agree_with_scalar_rounding) {
  // 8-lane vector bodies plus scalar tails must round identically.
  for (size_t n : {5, 8, 16, 19, 1003}) {
    std::vector<uint16_t> a(n), b(n), bf(n);
    std::vector<_Float16> ha(n), hb(n), hout(n);
    for (size_t i = 0; i < n; ++i) {
      float x = 0.37f * i - 11.f, y = 1.0f / (1 + i) + 300.f;
      a[i] = toBf16(x);
      b[i] = toBf16(y);
      ha[i] = static_cast<_Float16>(x);
      hb[i] = static_cast<_Float16>(y);
    }
    for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max}) {
      reduceTo(bf.data(), a.data(), b.data(), n, {DType::BF16, op});
      reduceTo(hout.data(), ha.data(), hb.data(), n, {DType::F16, op});
      for (size_t i = 0; i < n; ++i) {
        float x = fromBf16(a[i]), y = fromBf16(b[i]);
        float r = op == RedOp::Sum    ? x + y
                  : op == RedOp::Prod ? x * y
                  : op == RedOp::Min  ? std::min(x, y)
                                      : std::max(x, y);
        CHECK(bf[i] == toBf16(r));
        float hx = static_cast<float>(ha[i]), hy = static_cast<float>(hb[i]);
        float hr = op == RedOp::Sum    ? hx + hy
                   : op == RedOp::Prod ? hx * hy
                   : op == RedOp::Min  ? std::min(hx, hy)
                                       : std::max(hx, hy);
        CHECK(static_cast<float>(hout[i]) == static_cast<float>(static_cast<_Float16>(hr)));
      }
    }
  }
  uint16_t nanA[8], one[8], o[8];
  for (int i = 0; i < 8; ++i) {
    nanA[i] = 0x7fc1;  // bf16 NaN
    one[i] = toBf16(1.f);
  }
  reduceTo(o, nanA, one, 8, {DType::BF16, RedOp::Max});
  for (int i = 0; i < 8; ++i) CHECK(std::isnan(fromBf16(o[i])));
}

TEST(wire_pack_unpack_reduce_round) {
  // Against scalar references (_Float16 casts, bit-exact bf16 rounding), over
  // lengths around the vector width so the tails are covered.
  for (size_t n : {0, 1, 7, 8, 9, 33, 1001}) {
    std::vector<float> x(n), acc(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = (static_cast<float>(i % 97) - 48.3f) * 1.0009765625f;
      acc[i] = static_cast<float>(i % 13) * 0.3f;
    }
    for (Wire w : {Wire::F16, Wire::BF16}) {
      auto ref16 = [&](float f) {
        if (w == Wire::BF16) return fromBf16(toBf16(f));
        return static_cast<float>(static_cast<_Float16>(f));
      };
      std::vector<uint16_t> packed(n);
      std::vector<float> back(n), sum(acc), rounded(acc);
      packToWire(packed.data(), x.data(), n, w);
      unpackFromWire(back.data(), packed.data(), n, w);
      reduceFromWire(sum.data(), packed.data(), n, {w, RedOp::Sum});
      reduceFromWire(rounded.data(), packed.data(), n, {w, RedOp::Sum, /*roundTo=*/w});
      // Out of place: acc is the first operand and is left as it was.
      std::vector<float> apart(n, -7.0f), apartRounded(n, -7.0f);
      reduceFromWire(apart.data(), packed.data(), n, {w, RedOp::Sum, Wire::F32, acc.data()});
      reduceFromWire(apartRounded.data(), packed.data(), n, {w, RedOp::Sum, w, acc.data()});
      std::vector<float> r(x);
      roundToWire(r.data(), n, w);
      for (size_t i = 0; i < n; ++i) {
        CHECK(back[i] == ref16(x[i]));
        CHECK(r[i] == ref16(x[i]));
        CHECK(sum[i] == acc[i] + ref16(x[i]));  // float32 addition
        CHECK(rounded[i] == ref16(acc[i] + ref16(x[i])));
        CHECK(apart[i] == sum[i] && apartRounded[i] == rounded[i]);
        CHECK(acc[i] == static_cast<float>(i % 13) * 0.3f);
      }
    }
  }
}

TEST(wire_fp16_overflow_is_counted_by_the_pack) {
  std::vector<float> x(37, 1.0f);
  std::vector<uint16_t> out(37);
  uint64_t before = tlsFp16Overflows;
  packToWire(out.data(), x.data(), x.size(), Wire::F16);
  CHECK(tlsFp16Overflows == before);
  x[3] = std::numeric_limits<float>::infinity();  // already inf: not an overflow
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[9] = 65504.0f;  // the largest fp16 value
  packToWire(out.data(), x.data(), x.size(), Wire::F16);
  CHECK(tlsFp16Overflows == before);
  x[30] = -70000.0f;  // in the vector part
  packToWire(out.data(), x.data(), x.size(), Wire::F16);
  CHECK(tlsFp16Overflows == before + 1);
  x[30] = 1.0f;
  x[36] = 65520.0f;  // in the tail; rounds to inf
  packToWire(out.data(), x.data(), x.size(), Wire::F16);
  CHECK(tlsFp16Overflows == before + 2);
  packToWire(out.data(), x.data(), x.size(), Wire::BF16);  // bf16 has float32's range
  CHECK(tlsFp16Overflows == before + 2);
}

// reduceToStreaming writes what reduceTo writes, for every float32 op
// (NaN included), any alignment of out, and falls back for other dtypes.
TEST(reduce_streaming_matches_reduce_to) {
  const size_t n = 4099;
  std::vector<float> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 101) * 0.37f - 11.0f;
    b[i] = static_cast<float>(i % 89) * -0.21f + 3.0f;
  }
  a[5] = NAN;
  b[4000] = NAN;
  for (RedOp op : {RedOp::Sum, RedOp::Prod, RedOp::Min, RedOp::Max})
    for (size_t shift : {0, 1, 3, 7})  // out at every 4-byte offset from 32-byte alignment
      for (size_t count : {size_t{0}, size_t{5}, n - shift}) {
        std::vector<float> want(n + 8, 9.0f), got(n + 8, 9.0f);
        reduceTo(want.data() + shift, a.data(), b.data(), count, {DType::F32, op});
        reduceToStreaming(got.data() + shift, a.data(), b.data(), count, {DType::F32, op});
        CHECK(std::memcmp(want.data(), got.data(), want.size() * 4) == 0);
      }
  std::vector<int64_t> x(33, 5), y(33, 7), want(33), got(33);
  reduceTo(want.data(), x.data(), y.data(), 33, {DType::I64, RedOp::Prod});
  reduceToStreaming(got.data(), x.data(), y.data(), 33, {DType::I64, RedOp::Prod});
  CHECK(want == got && got[0] == 35);
}
