#include "backend/reduce_scaling.h"

#include "backend/arg_checks.h"

namespace smdccl {

namespace {
const char* bitwiseOpName(::c10d::ReduceOp::RedOpType t) {
  switch (t) {
    case ::c10d::ReduceOp::BAND: return "BAND";
    case ::c10d::ReduceOp::BOR: return "BOR";
    default: return "BXOR";
  }
}
}  // namespace

ReduceSpec toReduceSpec(const ::c10d::ReduceOp& rop, at::ScalarType t, int worldSize,
                        const char* opName) {
  toDType(t, opName);  // reductions need a kernel for the dtype; moving data does not
  ReduceSpec s;
  bool floating = at::isFloatingType(t);
  switch (rop.op_) {
    case ::c10d::ReduceOp::SUM: s.op = RedOp::Sum; break;
    case ::c10d::ReduceOp::PRODUCT: s.op = RedOp::Prod; break;
    case ::c10d::ReduceOp::MIN: s.op = RedOp::Min; break;
    case ::c10d::ReduceOp::MAX: s.op = RedOp::Max; break;
    case ::c10d::ReduceOp::BAND:
    case ::c10d::ReduceOp::BOR:
    case ::c10d::ReduceOp::BXOR:
      SMDCCL_VALUE_CHECK(!floating, opName, " with ReduceOp.", bitwiseOpName(rop.op_),
                         " needs an integer or bool tensor, got ", torchDtypeName(t));
      s.op = rop.op_ == ::c10d::ReduceOp::BAND  ? RedOp::BAnd
             : rop.op_ == ::c10d::ReduceOp::BOR ? RedOp::BOr
                                                : RedOp::BXor;
      break;
    case ::c10d::ReduceOp::AVG:
      SMDCCL_VALUE_CHECK(floating, opName, " with ReduceOp.AVG needs a floating-point tensor, got ",
                         t, "; use SUM and divide, or convert to float");
      s.op = RedOp::Sum;
      // 16-bit sums of many ranks can overflow where the average would not:
      // scale those first, by the power of two at or above the world size,
      // which is exact in 16 bits (1/3 would round every input once more
      // before the sum), and finish with one multiply by 2^k/n. Wider types
      // divide the exact-as-possible sum.
      if (t == at::kHalf || t == at::kBFloat16) {
        double pow2 = powerOfTwoAtLeast(worldSize);
        s.preScale = 1.0 / pow2;
        s.postDivide = worldSize / pow2;
      } else {
        s.postDivide = worldSize;
      }
      break;
    case ::c10d::ReduceOp::PREMUL_SUM: {
      SMDCCL_VALUE_CHECK(floating, opName, " with PREMUL_SUM needs a floating-point tensor, got ",
                         t);
      s.op = RedOp::Sum;
      auto* sup = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      SMDCCL_VALUE_CHECK(sup != nullptr, opName, ": PREMUL_SUM without a factor");
      if (sup->tensor_factor.defined()) {
        const at::Tensor& f = sup->tensor_factor;
        // Checked here, at the call: applying it later on the progress
        // thread would fail there with torch's own message.
        SMDCCL_VALUE_CHECK(
            f.device().is_cpu() && f.numel() == 1 && at::isFloatingType(f.scalar_type()), opName,
            ": the PREMUL_SUM factor must be a real floating-point CPU tensor "
            "of one element (or a Python number), got a ",
            f.scalar_type(), " tensor of ", f.numel(), " element(s) on ", f.device());
        s.preScaleTensor = f;
      } else {
        s.preScale = sup->double_factor;
      }
      break;
    }
    default:
      SMDCCL_VALUE_CHECK(false, opName,
                         " does not support this ReduceOp (supported: SUM, AVG, MIN, "
                         "MAX, PRODUCT, PREMUL_SUM, BAND, BOR, BXOR)");
  }
  return s;
}

void applyPreScale(at::Tensor& t, const ReduceSpec& spec) {
  if (spec.preScaleTensor.defined()) t.mul_(spec.preScaleTensor.to(t.device()));
  else if (spec.preScale != 1.0) t.mul_(spec.preScale);
}

double powerOfTwoAtLeast(int n) {
  double p = 1.0;
  while (p < n) p *= 2.0;
  return p;
}

void applyPostDivide(at::Tensor& t, const ReduceSpec& spec) {
  if (spec.postDivide != 1.0) t.div_(spec.postDivide);
}

}  // namespace smdccl
