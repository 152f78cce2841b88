#include "transport/cuda/ipc_space.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "common/hex.h"
#include "common/log.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// A value of the store exchange: "pid:device:handle", or
// "error:<why>" from a rank that has no buffer to share.
constexpr const char* kErrorTag = "error:";

}  // namespace

void* allocateDeviceMemory(size_t bytes, int device, const std::function<void()>& freeCached,
                           const std::string& what, const std::string& advice) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaErrorMemoryAllocation && freeCached) {
    (void)cudaGetLastError();  // the failure is handled here, not by a later check
    freeCached();
    e = cudaMalloc(&p, bytes);
  }
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    size_t freeBytes = 0, total = 0;
    cudaMemGetInfo(&freeBytes, &total);
    throw CommError(CommError::Kind::System,
                    strCat("could not allocate ", (bytes + (1 << 20) - 1) >> 20,
                           " MiB on CUDA device ", device, " for ", what, ": out of memory",
                           freeCached ? ", also after torch's cached blocks were released" : "",
                           " (", freeBytes >> 20, " of ", total >> 20, " MiB free); ", advice));
  }
  if (e != cudaSuccess) throwCudaError(e, "cudaMalloc");
  return p;
}

CudaIpcSpace::CudaIpcSpace(KVStore& store, const Spec& s, Deadline deadline)
    : store_(&store),
      keyPrefix_(s.keyPrefix),
      localRank_(s.localRank),
      device_(s.device),
      bytes_(s.bytes),
      ptrs_(s.localSize, nullptr) {
  const int localRank = s.localRank, localSize = s.localSize;
  DeviceScope scope(s.device);
  std::string mine;
  try {
    void* p = allocateDeviceMemory(
        s.bytes, s.device, s.freeCached,
        strCat("smdccl's CUDA IPC buffer (SMDCCL_CUDA_IPC_MB=", s.bytes >> 20, ")"),
        "set SMDCCL_CUDA_IPC_MB lower, or SMDCCL_CUDA_IPC=0 to stage through host memory");
    ptrs_[localRank] = static_cast<char*>(p);
    cudaIpcMemHandle_t handle;
    SMDCCL_CUDA_CHECK(cudaIpcGetMemHandle(&handle, p));
    // The pid makes a stale key from an earlier group of the same name
    // recognisable in logs; the handle itself is what peers open.
    mine = strCat(getpid(), ":", s.device, ":", toHex(&handle, sizeof handle));
  } catch (const std::exception& e) {
    // Node-mates wait for this rank's handle: tell them at once why there is none.
    store.set(strCat(s.keyPrefix, "/", localRank), strCat(kErrorTag, e.what()));
    release();
    throw;
  }
  try {
    std::vector<std::string> all =
        allGatherStrings(store, {s.keyPrefix, localRank, localSize, deadline}, mine);
    for (int l = 0; l < localSize; ++l) {
      if (l == localRank) continue;
      const std::string& v = all[static_cast<size_t>(l)];
      if (v.rfind(kErrorTag, 0) == 0)
        throw CommError(CommError::Kind::PeerFailure,
                        strCat("local rank ", l, " of this node has no CUDA IPC buffer to share: ",
                               v.substr(std::char_traits<char>::length(kErrorTag))));
      cudaIpcMemHandle_t peer;
      if (!fromHex(v.substr(v.rfind(':') + 1), &peer, sizeof peer))
        throw CommError(CommError::Kind::Protocol, "malformed CUDA IPC handle in the store");
      void* p = nullptr;
      // Lazy peer access: a buffer on another GPU of the node is reached
      // over NVLink / PCIe; one on this GPU needs none.
      cudaError_t e = cudaIpcOpenMemHandle(&p, peer, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess)
        throw CommError(CommError::Kind::System,
                        strCat("could not map local rank ", l, "'s CUDA IPC buffer: ",
                               cudaGetErrorName(e), " (", cudaGetErrorString(e),
                               "); without peer access between the node's GPUs, "
                               "SMDCCL_CUDA_IPC=0 stages through host memory instead"));
      ptrs_[static_cast<size_t>(l)] = static_cast<char*>(p);
    }
  } catch (...) {
    // This rank's handle is out: a node-mate may have mapped its buffer
    // already, and freeing memory another process maps is undefined. It
    // stays allocated until exit (the destructor's unmapped round, which
    // would free it safely, needs node-mates that are failing with this).
    unmapPeers();
    SMDCCL_INFO("CUDA IPC: this rank's buffer of ", s.bytes >> 20,
                " MiB stays allocated until exit: the node's IPC setup failed after its handle "
                "was shared");
    ptrs_[static_cast<size_t>(localRank)] = nullptr;
    throw;
  }
  SMDCCL_INFO("CUDA IPC: ", localSize, " buffers of ", s.bytes >> 10, " KiB mapped on device ",
              s.device);
}

// Frees this rank's buffer and unmaps the peers' (errors ignored): once no
// peer can map it (before its handle is shared, or after the unmapped round).
void CudaIpcSpace::release() noexcept {
  unmapPeers();
  DeviceScope scope(device_, /*strict=*/false);
  char*& own = ptrs_[static_cast<size_t>(localRank_)];
  if (own) cudaFree(own);
  own = nullptr;
}

void CudaIpcSpace::unmapPeers() noexcept {
  DeviceScope scope(device_, /*strict=*/false);
  for (size_t l = 0; l < ptrs_.size(); ++l) {
    if (!ptrs_[l] || static_cast<int>(l) == localRank_) continue;
    cudaIpcCloseMemHandle(ptrs_[l]);
    ptrs_[l] = nullptr;
  }
}

CudaIpcSpace::~CudaIpcSpace() {
  unmapPeers();
  if (ptrs_.size() > 1 && ptrs_[static_cast<size_t>(localRank_)]) {
    try {
      allGatherStrings(
          *store_, {keyPrefix_ + "/unmapped", localRank_, localSize(), Deadline::after(kUnmapWait)},
          "1");
    } catch (const std::exception& e) {
      // Also at process exit without destroy_process_group (the store may be
      // gone): the memory goes with the process.
      SMDCCL_INFO("CUDA IPC: this rank's buffer of ", bytes_ >> 20, " MiB stays allocated until ",
                  "exit: not every node-mate has unmapped it (", e.what(), ")");
      ptrs_[static_cast<size_t>(localRank_)] = nullptr;
      return;
    }
  }
  release();
}

}  // namespace smdccl
