#pragma once
// How a torch ReduceOp runs on the engine: an associative op, and the
// scaling torch's AVG and PREMUL_SUM add before and after it.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include "common/dtype.h"

namespace smdccl {

// How a torch ReduceOp maps onto the engine: an associative op plus a scale
// applied to the local input before (PREMUL_SUM; AVG on 16-bit types, by an
// exact power of two) and a divisor applied to the result after (AVG).
struct ReduceSpec {
  RedOp op = RedOp::Sum;
  double preScale = 1.0;
  at::Tensor preScaleTensor;  // PREMUL_SUM given a tensor factor
  double postDivide = 1.0;
  bool needsPreScale() const { return preScale != 1.0 || preScaleTensor.defined(); }
};

// Also raises for a dtype the reductions do not support.
ReduceSpec toReduceSpec(const ::c10d::ReduceOp& rop, at::ScalarType t, int worldSize,
                        const char* opName);

// The smallest power of two >= n: AVG's exact 16-bit pre-scale is its inverse.
double powerOfTwoAtLeast(int n);

// Applies the scale parts of a ReduceSpec in place.
void applyPreScale(at::Tensor& t, const ReduceSpec& spec);
void applyPostDivide(at::Tensor& t, const ReduceSpec& spec);

}  // namespace smdccl
