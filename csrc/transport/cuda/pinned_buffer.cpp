#include "transport/cuda/pinned_buffer.h"

#include <cuda_runtime_api.h>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

PinnedBuffer::~PinnedBuffer() {
  if (data_) cudaFreeHost(data_);
}

char* PinnedBuffer::reserve(size_t bytes) {
  if (bytes <= capacity_) return data_;
  // Round up (1 MiB) so that a series of slightly growing messages does not
  // re-pin every time; pinning is slow (page-locking the range).
  size_t want = (bytes + (1u << 20) - 1) & ~size_t((1u << 20) - 1);
  if (data_) {
    cudaFreeHost(data_);
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
