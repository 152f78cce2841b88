#pragma once
// One device buffer per rank of a node, mapped into every node-mate's
// address space through CUDA IPC: the intra-node transport for CUDA tensors.
// A rank writes its data into its own buffer, the node's ranks meet at a
// barrier, and each then reads its peers' buffers directly (NVLink / the
// same GPU's memory), with no host copy. Ranks may share one GPU.
#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/store.h"

namespace smdccl {

// cudaMalloc of `bytes` on the current device (`device`, for messages): out
// of memory, `freeCached` runs (if given) and it is tried once more; a
// second failure raises a CommError that names `what` the memory is for and
// says `advice` (the setting to change).
void* allocateDeviceMemory(size_t bytes, int device, const std::function<void()>& freeCached,
                           const std::string& what, const std::string& advice);

class CudaIpcSpace {
 public:
  // This rank's part in the node's buffers.
  struct Spec {
    std::string keyPrefix;  // where the handles go in the store
    int localRank;
    int localSize;
    int device;
    // Each rank's buffer; alike on the node (GpuContext::agreeOnTuning
    // checks the settings that size it before any path runs).
    size_t bytes;
    // Out of memory: runs (torch's caching allocator handing its idle
    // blocks back) before the one retry; may be empty.
    std::function<void()> freeCached;
  };
  // Collective over the node's ranks (each calls it with its local index):
  // allocates s.bytes on s.device, publishes the IPC handle under
  // s.keyPrefix/<local> in the store and maps every node-mate's buffer. A
  // rank that cannot allocate (after the retry) tells its node-mates, which
  // fail at once; its own error names SMDCCL_CUDA_IPC_MB, which sized the
  // buffer. A failure after this rank's handle was shared leaves its buffer
  // allocated until the process exits (a node-mate may map it).
  CudaIpcSpace(KVStore& store, const Spec& s, Deadline deadline);
  // Unmaps the peers' buffers, then frees this rank's own only once every
  // node-mate has unmapped it (a store round under `keyPrefix`/unmapped, up
  // to kUnmapWait): freeing memory that another process still maps is
  // undefined in CUDA. A node-mate that does not say so in time (it died, or
  // never destroys the group) leaves this rank's buffer allocated until the
  // process exits. The store must outlive this object.
  ~CudaIpcSpace();
  static constexpr std::chrono::seconds kUnmapWait{10};
  CudaIpcSpace(const CudaIpcSpace&) = delete;
  CudaIpcSpace& operator=(const CudaIpcSpace&) = delete;

  // Local rank l's buffer in this process's address space (l == local
  // rank: this rank's own).
  char* buffer(int l) const { return ptrs_[static_cast<size_t>(l)]; }
  const std::vector<char*>& buffers() const { return ptrs_; }
  size_t bytes() const { return bytes_; }
  int localRank() const { return localRank_; }
  int localSize() const { return static_cast<int>(ptrs_.size()); }

 private:
  void release() noexcept;
  // Unmaps the peers' buffers (this rank's own stays).
  void unmapPeers() noexcept;

  KVStore* store_ = nullptr;
  std::string keyPrefix_;
  int localRank_ = 0;
  int device_ = 0;
  size_t bytes_ = 0;
  std::vector<char*> ptrs_;
};

}  // namespace smdccl
