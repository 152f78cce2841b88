#include "algorithms/cuda/gpu_context.h"

#include <algorithm>

#include "common/env.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

GpuTuning GpuTuning::fromEnv() {
  GpuTuning t;
  t.ipc = envInt(env::kCudaIpc) != 0;
  t.ipcBytes = static_cast<size_t>(std::max<int64_t>(1, envInt(env::kCudaIpcMB))) << 20;
  t.oneShotBytes = static_cast<size_t>(std::max<int64_t>(0, envInt(env::kCudaOneShotKB))) << 10;
  t.stageChunkBytes =
      static_cast<size_t>(std::max<int64_t>(64, envInt(env::kCudaStageChunkKB))) << 10;
  return t;
}

GpuContext::GpuContext(int device, cudaStream_t stream, KVStore& store, GpuTuning tuning)
    : device_(device), stream_(stream), store_(store), tuning_(tuning) {}

GpuContext::~GpuContext() {
  // Nothing of ours may still be running when the buffers go.
  cudaStreamSynchronize(stream_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

cudaEvent_t GpuContext::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e;
    SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  return events_[i];
}

CudaIpcSpace& GpuContext::ipc(int node, int localRank, int localSize, Deadline deadline) {
  if (!ipc_)
    ipc_ = std::make_unique<CudaIpcSpace>(
        store_, strCat("smdccl/cuda_ipc/node", node), localRank, localSize, device_,
        tuning_.ipcBytes,
        strCat("SMDCCL_CUDA_IPC_MB=", tuning_.ipcBytes >> 20,
               ",SMDCCL_CUDA_ONESHOT_KB=", tuning_.oneShotBytes >> 10),
        deadline);
  return *ipc_;
}

}  // namespace smdccl
