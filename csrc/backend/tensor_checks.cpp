#include "backend/tensor_checks.h"

#include <cstdint>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace smdccl {

#define SMDCCL_VALUE_CHECK(cond, ...) TORCH_CHECK_VALUE(cond, "smdccl: ", __VA_ARGS__)

std::string torchDtypeName(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kDouble: return "float64";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    case at::kChar: return "int8";
    case at::kShort: return "int16";
    case at::kInt: return "int32";
    case at::kLong: return "int64";
    case at::kByte: return "uint8";
    case at::kBool: return "bool";
    case at::kComplexHalf: return "complex32";
    case at::kComplexFloat: return "complex64";
    case at::kComplexDouble: return "complex128";
    default: {  // UInt16, Float8_e4m3fn, ...: torch's name in lower case
      std::string name = c10::toString(t);
      std::transform(name.begin(), name.end(), name.begin(),
                     [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
      return name;
    }
  }
}

DType toDType(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return DType::F32;
    case at::kDouble: return DType::F64;
    case at::kHalf: return DType::F16;
    case at::kBFloat16: return DType::BF16;
    case at::kChar: return DType::I8;
    case at::kInt: return DType::I32;
    case at::kLong: return DType::I64;
    case at::kByte: return DType::U8;
    case at::kBool: return DType::Bool;
    default:
      SMDCCL_VALUE_CHECK(false, op, " does not support dtype ", torchDtypeName(t),
                         " (it reduces float32, float64, float16, bfloat16, int8, int32, int64, "
                         "uint8, bool; collectives that only move data take any dtype)");
  }
}

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
                        const char* op) {
  toDType(t, op);  // reductions need a kernel for the dtype; moving data does not
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
      SMDCCL_VALUE_CHECK(!floating, op, " with ReduceOp.", bitwiseOpName(rop.op_),
                         " needs an integer or bool tensor, got ", torchDtypeName(t));
      s.op = rop.op_ == ::c10d::ReduceOp::BAND  ? RedOp::BAnd
             : rop.op_ == ::c10d::ReduceOp::BOR ? RedOp::BOr
                                                : RedOp::BXor;
      break;
    case ::c10d::ReduceOp::AVG:
      SMDCCL_VALUE_CHECK(floating, op, " with ReduceOp.AVG needs a floating-point tensor, got ", t,
                         "; use SUM and divide, or convert to float");
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
      SMDCCL_VALUE_CHECK(floating, op, " with PREMUL_SUM needs a floating-point tensor, got ", t);
      s.op = RedOp::Sum;
      auto* sup = dynamic_cast<::c10d::NCCLPreMulSumSupplement*>(rop.supplement_.get());
      SMDCCL_VALUE_CHECK(sup != nullptr, op, ": PREMUL_SUM without a factor");
      if (sup->tensor_factor.defined()) {
        const at::Tensor& f = sup->tensor_factor;
        // Checked here, at the call: applying it later on the progress
        // thread would fail there with torch's own message.
        SMDCCL_VALUE_CHECK(
            f.device().is_cpu() && f.numel() == 1 && at::isFloatingType(f.scalar_type()), op,
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
      SMDCCL_VALUE_CHECK(false, op,
                         " does not support this ReduceOp (supported: SUM, AVG, MIN, "
                         "MAX, PRODUCT, PREMUL_SUM, BAND, BOR, BXOR)");
  }
  return s;
}

at::Tensor realView(const at::Tensor& t, const ::c10d::ReduceOp& rop, const char* op,
                    const char* what) {
  if (!t.defined() || !t.is_complex()) return t;
  checkTensor(t, op, what);  // view_as_real needs a dense, contiguous one
  auto k = rop.op_;
  SMDCCL_VALUE_CHECK(
      k == ::c10d::ReduceOp::SUM || k == ::c10d::ReduceOp::AVG || k == ::c10d::ReduceOp::PREMUL_SUM,
      op, ": ", what, " is ", torchDtypeName(t.scalar_type()),
      ": complex tensors reduce with SUM, AVG or PREMUL_SUM (the other ops are "
      "not defined on complex numbers part by part)");
  return at::view_as_real(t);
}

std::vector<at::Tensor> realViews(const std::vector<at::Tensor>& ts, const ::c10d::ReduceOp& rop,
                                  const char* op, const char* what) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(realView(t, rop, op, what));
  return out;
}

void checkTensor(const at::Tensor& t, const char* op, const char* what) {
  SMDCCL_VALUE_CHECK(t.defined(), op, ": ", what, " is undefined");
#ifdef SMDCCL_WITH_CUDA
  SMDCCL_VALUE_CHECK(
      t.device().is_cpu() || t.is_cuda(), op, ": ", what, " is on ", t.device(),
      "; smdccl runs collectives on CPU and CUDA tensors (move it with .cpu() or .cuda())");
#else
  SMDCCL_VALUE_CHECK(t.device().is_cpu(), op, ": ", what, " is on ", t.device(),
                     "; this build of smdccl has no CUDA support (built without nvcc or against "
                     "a CPU build of torch): move it with .cpu(), or rebuild smdccl where nvcc "
                     "and a CUDA torch are found");
#endif
  SMDCCL_VALUE_CHECK(
      t.layout() == at::kStrided, op, ": ", what,
      " must be a dense (strided) tensor (of the collectives, only all_reduce takes a "
      "sparse COO tensor)");
  SMDCCL_VALUE_CHECK(t.is_contiguous(), op, ": ", what,
                     " must be contiguous; call .contiguous() on it first");
  // Any dtype: collectives that only move data (broadcast, all_gather,
  // all_to_all, gather, scatter, send/recv) copy bytes, e.g. float8 weights
  // for an FSDP all-gather. Reductions check their dtype (toReduceSpec).
}

const at::Tensor& checkSingle(const std::vector<at::Tensor>& ts, const char* op) {
  SMDCCL_VALUE_CHECK(ts.size() == 1, op, " takes exactly one tensor per rank, got ", ts.size());
  checkTensor(ts[0], op, "tensor");
  return ts[0];
}

void checkSameShapeAndType(const at::Tensor& t, const at::Tensor& ref, const char* op,
                           const std::string& what) {
  checkTensor(t, op, what.c_str());
  SMDCCL_VALUE_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", what, " has dtype ",
                     t.scalar_type(), " but the input has ", ref.scalar_type());
  SMDCCL_VALUE_CHECK(t.numel() == ref.numel(), op, ": ", what, " has ", t.numel(),
                     " elements but the input has ", ref.numel());
}

void checkRank(int64_t r, int size, const char* op, const char* what) {
  SMDCCL_VALUE_CHECK(r >= 0 && r < size, op, ": ", what, " ", r, " is out of range for a group of ",
                     size, " ranks");
}

std::string nonFiniteReport(const at::Tensor& t) {
  // The reduction dtypes only: isfinite has no kernel for float8 and the like.
  auto type = t.scalar_type();
  bool checked =
      type == at::kFloat || type == at::kDouble || type == at::kHalf || type == at::kBFloat16;
  if (!checked || t.numel() == 0) return "";
  at::Tensor bad = at::isfinite(t.reshape({-1})).logical_not_().nonzero();
  if (bad.numel() == 0) return "";
  int64_t at0 = bad[0].item<int64_t>();
  return strCat(bad.numel(), " NaN/Inf value(s), the first at element ", at0, " (",
                t.reshape({-1})[at0].item<double>(), ")");
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

std::exception_ptr toTorchError(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    return std::current_exception();
  } catch (const InvalidArgument& ex) {
    try {
      C10_THROW_ERROR(ValueError, ex.what());
    } catch (...) { return std::current_exception(); }
  } catch (const std::exception& ex) {
    try {
      C10_THROW_ERROR(DistBackendError, ex.what());
    } catch (...) { return std::current_exception(); }
  }
  return e;
}

}  // namespace smdccl
