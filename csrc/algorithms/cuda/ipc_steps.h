#pragma once
// What the CUDA-IPC collectives of a node share: when they can run, and
// the check of CUDA calls (their steps meet at GpuContext::nodeBarrier).
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

// The node's ranks can reach each other's buffers over CUDA IPC: the whole
// group (not a sub-comm), IPC on, nodes of equal size with node-mates.
inline bool ipcUsable(const Hierarchy& h, const GpuTuning& t) {
  return t.ipc && h.localSize() > 1 && h.uniform() && h.localSize() <= cuda::kMaxReduceInputs;
}
inline bool ipcUsable(const Comm& c, const GpuContext& g) {
  return c.levels && c.members.empty() && ipcUsable(*c.levels, g.tuning());
}

}  // namespace smdccl
