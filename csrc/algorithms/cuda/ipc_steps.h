#pragma once
// What every CUDA-IPC collective of a node does between its steps: meet the
// node's ranks at a barrier once each stream has finished its part, so that
// peers' buffers may be read, or reused, by everyone.
#include <cuda_runtime_api.h>

#include "algorithms/collectives.h"
#include "algorithms/comm.h"
#include "algorithms/cuda/gpu_context.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"

namespace smdccl {

inline void checkCuda(cudaError_t e, const char* what) {
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

// This rank's stream is done with step `what`, and so is every node-mate's
// (a stream barrier: the host goes on; see GpuContext::nodeBarrier).
inline void ipcStepDone(GpuContext& g, Comm& c, Comm& local, const char* what) {
  g.nodeBarrier(c, local, what);
}

}  // namespace smdccl
