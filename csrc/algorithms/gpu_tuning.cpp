#include "algorithms/gpu_tuning.h"

#include "common/env.h"
#include "common/error.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_INT(kCudaIpc, "SMDCCL_CUDA_IPC", 1, 0, 1,
               "CUDA tensors: 1 moves data between the GPUs (or processes sharing a GPU) of a "
               "node through CUDA IPC buffers; 0 stages everything through pinned host memory "
               "and the CPU transports.");
SMDCCL_ENV_CHOICE(kIntra, "SMDCCL_INTRA", "auto", "auto, nccl, ipc",
                  "CUDA collectives inside a node: auto runs them on NCCL (loaded from torch's "
                  "installation) where every rank of the node has a GPU of its own and on "
                  "smdccl's CUDA IPC kernels otherwise (ranks sharing a GPU, NCCL missing); nccl "
                  "or ipc forces one (nccl where NCCL cannot be loaded is an error). Between "
                  "nodes the host reduces either way.");
SMDCCL_ENV_INT(kCudaIpcMB, "SMDCCL_CUDA_IPC_MB", 64, 1, 1 << 16,
               "Size of each rank's CUDA IPC buffer, in MiB (allocated at the group's first "
               "collective over CUDA IPC); larger messages go through it in pieces of this "
               "size.");
SMDCCL_ENV_INT(kCudaStageChunkKB, "SMDCCL_CUDA_STAGE_CHUNK_KB", 4096, 64, 1 << 20,
               "CUDA tensors that cross nodes (or every CUDA collective with SMDCCL_CUDA_IPC=0) "
               "go through pinned host memory in chunks of this many KiB, so copies overlap the "
               "network; float32 data of a compressed group is cast to its 16-bit wire on the "
               "GPU first, so half the bytes cross PCIe.");
SMDCCL_ENV_INT(kCudaMaxSms, "SMDCCL_CUDA_MAX_SMS", 0, 0, 4096,
               "SMs smdccl's CUDA kernels (reductions, gathers, 16-bit casts) may fill; 0: all. "
               "A cap leaves the rest to the training's own kernels so that collectives overlap "
               "with them; it changes speed, never results. Per process.");
SMDCCL_ENV_INT(kCudaPinnedShrinkOps, "SMDCCL_CUDA_PINNED_SHRINK_OPS", 64, 0, 1 << 20,
               "CUDA tensors staged through pinned host memory: the staging buffer grows to the "
               "largest message at once, and after this many ops in a row that used at most a "
               "quarter of it, shrinks to the largest of them (freed off the op's thread); 0 "
               "keeps it at its peak. Per process.");
}  // namespace env

GpuTuning GpuTuning::fromEnv() {
  GpuTuning t;
  t.ipc = envInt(env::kCudaIpc) != 0;
  t.intra = envChoice(env::kIntra);
  // envInt range-checks these: no clamping here.
  t.ipcBytes = static_cast<size_t>(envInt(env::kCudaIpcMB)) << 20;
  t.stageChunkBytes = static_cast<size_t>(envInt(env::kCudaStageChunkKB)) << 10;
  t.maxSms = static_cast<int>(envInt(env::kCudaMaxSms));
  t.pinnedShrinkOps = static_cast<int>(envInt(env::kCudaPinnedShrinkOps));
  return t;
}

std::string GpuTuning::describe() const {
  return strCat("SMDCCL_CUDA_IPC=", ipc ? 1 : 0, ", SMDCCL_INTRA=", intra, ", SMDCCL_CUDA_IPC_MB=", ipcBytes >> 20,
                ", SMDCCL_CUDA_STAGE_CHUNK_KB=", stageChunkBytes >> 10);
}

}  // namespace smdccl
