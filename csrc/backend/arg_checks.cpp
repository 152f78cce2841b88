#include "backend/arg_checks.h"

#include <cstdint>

#include <algorithm>
#include <cctype>

#include "common/error.h"

namespace smdccl {

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

DType toDType(at::ScalarType t, const char* opName) {
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
      SMDCCL_VALUE_CHECK(false, opName, " does not support dtype ", torchDtypeName(t),
                         " (it reduces float32, float64, float16, bfloat16, int8, int32, int64, "
                         "uint8, bool; collectives that only move data take any dtype)");
  }
}

at::Tensor realView(const at::Tensor& t, const ::c10d::ReduceOp& rop, const char* opName,
                    const char* what) {
  if (!t.defined() || !t.is_complex()) return t;
  checkTensor(t, opName, what);  // view_as_real needs a dense, contiguous one
  auto k = rop.op_;
  SMDCCL_VALUE_CHECK(
      k == ::c10d::ReduceOp::SUM || k == ::c10d::ReduceOp::AVG || k == ::c10d::ReduceOp::PREMUL_SUM,
      opName, ": ", what, " is ", torchDtypeName(t.scalar_type()),
      ": complex tensors reduce with SUM, AVG or PREMUL_SUM (the other ops are "
      "not defined on complex numbers part by part)");
  return at::view_as_real(t);
}

std::vector<at::Tensor> realViews(const std::vector<at::Tensor>& ts, const ::c10d::ReduceOp& rop,
                                  const char* opName, const char* what) {
  std::vector<at::Tensor> out;
  out.reserve(ts.size());
  for (const auto& t : ts) out.push_back(realView(t, rop, opName, what));
  return out;
}

void checkTensor(const at::Tensor& t, const char* opName, const char* what) {
  SMDCCL_VALUE_CHECK(t.defined(), opName, ": ", what, " is undefined");
#ifdef SMDCCL_WITH_CUDA
  SMDCCL_VALUE_CHECK(
      t.device().is_cpu() || t.is_cuda(), opName, ": ", what, " is on ", t.device(),
      "; smdccl runs collectives on CPU and CUDA tensors (move it with .cpu() or .cuda())");
#else
  SMDCCL_VALUE_CHECK(t.device().is_cpu(), opName, ": ", what, " is on ", t.device(),
                     "; this build of smdccl has no CUDA support (built without nvcc or against "
                     "a CPU build of torch): move it with .cpu(), or rebuild smdccl where nvcc "
                     "and a CUDA torch are found");
#endif
  SMDCCL_VALUE_CHECK(
      t.layout() == at::kStrided, opName, ": ", what,
      " must be a dense (strided) tensor (of the collectives, only all_reduce takes a "
      "sparse COO tensor)");
  SMDCCL_VALUE_CHECK(t.is_contiguous(), opName, ": ", what,
                     " must be contiguous; call .contiguous() on it first");
  // Any dtype: collectives that only move data (broadcast, all_gather,
  // all_to_all, gather, scatter, send/recv) copy bytes, e.g. float8 weights
  // for an FSDP all-gather. Reductions check their dtype (toReduceSpec).
}

const at::Tensor& checkSingle(const std::vector<at::Tensor>& ts, const char* opName) {
  SMDCCL_VALUE_CHECK(ts.size() == 1, opName, " takes exactly one tensor per rank, got ", ts.size());
  checkTensor(ts[0], opName, "tensor");
  return ts[0];
}

void checkSameShapeAndType(const at::Tensor& t, const at::Tensor& ref, const char* opName,
                           const std::string& what) {
  checkTensor(t, opName, what.c_str());
  SMDCCL_VALUE_CHECK(t.scalar_type() == ref.scalar_type(), opName, ": ", what, " has dtype ",
                     t.scalar_type(), " but the input has ", ref.scalar_type());
  SMDCCL_VALUE_CHECK(t.numel() == ref.numel(), opName, ": ", what, " has ", t.numel(),
                     " elements but the input has ", ref.numel());
}

void checkRank(int64_t r, int size, const char* opName, const char* what) {
  SMDCCL_VALUE_CHECK(r >= 0 && r < size, opName, ": ", what, " ", r,
                     " is out of range for a group of ", size, " ranks");
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

}  // namespace smdccl
