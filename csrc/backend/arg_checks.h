#pragma once
// Validation of user arguments, raised at call time as ValueError with what
// to fix, and torch's dtypes as the engine's.
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "common/dtype.h"

// A ValueError whose message starts with "smdccl: ".
#define SMDCCL_VALUE_CHECK(cond, ...) TORCH_CHECK_VALUE(cond, "smdccl: ", __VA_ARGS__)

namespace smdccl {

DType toDType(at::ScalarType t, const char* opName);
// torch's Python name of a dtype ("int16", "float8_e4m3fn"), for messages.
std::string torchDtypeName(at::ScalarType t);

// Complex data reduces as its real and imaginary parts, the way torch's
// all_reduce hands it over (view_as_real) and gloo sums it: t as such a view
// for SUM, AVG and PREMUL_SUM (which act on the parts one by one), a
// ValueError for the ops that do not (MIN, MAX, PRODUCT, bitwise); any
// other tensor as it is. The view shares t's memory.
at::Tensor realView(const at::Tensor& t, const ::c10d::ReduceOp& rop, const char* opName,
                    const char* what);
std::vector<at::Tensor> realViews(const std::vector<at::Tensor>& ts, const ::c10d::ReduceOp& rop,
                                  const char* opName, const char* what);

// A defined CPU (or CUDA) strided, contiguous tensor, of any dtype.
void checkTensor(const at::Tensor& t, const char* opName, const char* what);
const at::Tensor& checkSingle(const std::vector<at::Tensor>& ts, const char* opName);
// SMDCCL_NAN_CHECK: "" when every value of t is finite (or t is not
// floating point), else how many are not and the first of them.
std::string nonFiniteReport(const at::Tensor& t);

void checkSameShapeAndType(const at::Tensor& t, const at::Tensor& ref, const char* opName,
                           const std::string& what);
void checkRank(int64_t r, int size, const char* opName, const char* what);

inline char* bytesOf(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

}  // namespace smdccl
