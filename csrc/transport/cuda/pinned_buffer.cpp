#include "transport/cuda/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
  for (char* p : retired_) cudaFreeHost(p);
}

char* PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return data_;
  // Round up (1 MiB) and grow by half at least, so that a series of growing
  // messages does not re-pin every time (pinning is slow: page-locking the
  // range) and the retired buffers add at most twice the current one.
  size_t want = (bytes + (1u << 20) - 1) & ~size_t((1u << 20) - 1);
  want = std::max(want, capacity_ + capacity_ / 2);
  if (data_) {
    retired_.push_back(data_);
    data_ = nullptr;
    capacity_ = 0;
  }
  void* p = nullptr;
  SMDCCL_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable));
  data_ = static_cast<char*>(p);
  capacity_ = want;
  return data_;
}

}  // namespace smdccl
