#pragma once
// CUDA runtime errors as smdccl exceptions (never an abort): the backend
// turns them into the Python exception of the failing collective.
#include <cuda_runtime_api.h>

#include "common/error.h"

namespace smdccl {

[[noreturn]] inline void throwCudaError(cudaError_t e, const char* what) {
  throw CommError(CommError::Kind::System,
                  strCat("CUDA error in ", what, ": ", cudaGetErrorName(e), " (",
                         cudaGetErrorString(e), ")"));
}

}  // namespace smdccl

#define SMDCCL_CUDA_CHECK(expr)                                  \
  do {                                                           \
    cudaError_t smdccl_err_ = (expr);                            \
    if (smdccl_err_ != cudaSuccess) ::smdccl::throwCudaError(smdccl_err_, #expr); \
  } while (0)
