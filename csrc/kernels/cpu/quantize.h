#pragma once
// Block-wise symmetric int8, the int8 wire's format. A piece of n float32
// values is cut into blocks of kInt8Block (the last may be shorter); a
// block with m = max|x| stores its scale s = m / 127 (float32) and
// q = round-half-even(x * (127 / m)), clamped to [-127, 127]; decoding
// gives q * s. So |x - decoded| <= s / 2 (plus float32 rounding of the
// products, below 2^-22 |x|). An all-zero block decodes to zeros, and so
// does one whose m is below 127 / FLT_MAX (3.7e-37: 127 / m would overflow;
// its error is at most m); a block holding inf or NaN decodes to NaN (loud,
// as AMP's overflow check wants).
// Layout of a piece: its ceil(n / kInt8Block) scales, then its n bytes.
// The arithmetic is plain float32 multiplication in this order, so the GPU
// kernels (kernels/cuda) give the same bits.
#include <cstddef>
#include <cstdint>

namespace smdccl {

// 128: 3.1 % of the bytes are scales (32: 12.5 %, 256: 1.6 %), so a
// link-bound allreduce can gain up to 1.94x over the fp16 wire; the error
// per block size is measured in docs/compression.md.
constexpr size_t kInt8Block = 128;

// Bytes of a quantized piece of n values.
inline size_t int8Bytes(size_t n) {
  return (n + kInt8Block - 1) / kInt8Block * sizeof(float) + n;
}

void quantizeInt8(void* dst, const float* src, size_t n);
// dst = a + decoded(src), float32 sums (a may be dst).
void dequantizeAddInt8(float* dst, const float* a, const void* src, size_t n);
// dst = decoded(src).
void dequantizeInt8(float* dst, const void* src, size_t n);

// One block's scale and its reciprocal step, as quantizeInt8 computes them
// (for the GPU kernels' tests and the error bounds of the algorithm tests).
struct Int8Scale {
  float scale;    // m / 127: what decoding multiplies by
  float inverse;  // 127 / m (0 for a block sent as zeros)
};
Int8Scale int8ScaleOf(float maxAbs);

}  // namespace smdccl
