#pragma once
// The SMDCCL_CUDA_* settings of the GPU paths, read from the environment.
// Plain data, no CUDA: built into every build, so that a CPU-only build
// declares (and documents) the same variables.
#include <cstddef>
#include <string>

namespace smdccl {

struct GpuTuning {
  bool ipc = true;                    // SMDCCL_CUDA_IPC
  std::string intra = "auto";         // SMDCCL_INTRA: auto, nccl, ipc
  size_t ipcBytes = 64u << 20;        // SMDCCL_CUDA_IPC_MB: each rank's IPC buffer
  size_t stageChunkBytes = 4u << 20;  // SMDCCL_CUDA_STAGE_CHUNK_KB: host staging pipeline
  int maxSms = 0;                     // SMDCCL_CUDA_MAX_SMS: 0, all (speed only: not agreed)
  int pinnedShrinkOps = 64;           // SMDCCL_CUDA_PINNED_SHRINK_OPS (memory only: not agreed)
  static GpuTuning fromEnv();
  // "SMDCCL_CUDA_IPC=1, SMDCCL_CUDA_IPC_MB=64, ..."
  std::string describe() const;
};

}  // namespace smdccl
