#pragma once
// What the CUDA-IPC collectives of a node share: the check of CUDA calls
// (their steps meet at GpuContext::nodeBarrier; when they run:
// algorithms/gpu_paths.h).
#include <cuda_runtime_api.h>

#include "algorithms/collectives.h"
#include "algorithms/comm.h"
#include "algorithms/cuda/gpu_context.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"

namespace smdccl {

inline void checkCuda(cudaError_t e, const char* what) {
  countCudaCall();
  if (e != cudaSuccess) throwCudaError(e, what);
}

}  // namespace smdccl
