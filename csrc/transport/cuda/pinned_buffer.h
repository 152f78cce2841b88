#pragma once
// Page-locked host memory for staging CUDA tensors through the host
// transports (TCP, shared memory): the GPU copies into and out of it
// asynchronously. Sized by a StagingSizer: grows on demand, shrinks again
// once a window of ops after a burst used at most a quarter of it. Its user
// orders reuse with `stream`: every copy into or out of it is on that
// stream, or joined into it.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/staging_sizer.h"

namespace smdccl {

class PinnedBuffer {
 public:
  // `shrinkWindow`: see StagingSizer (0: never shrinks).
  PinnedBuffer(int device, cudaStream_t stream, int shrinkWindow);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` long. Contents are lost when it is reallocated; the
  // caller must queue no copy on the old one after this call.
  char* reserve(size_t bytes);
  size_t capacity() const { return capacity_.load(); }
  // Outgrown buffers not freed yet.
  size_t retiredBytes() const { return retiredBytes_.load(); }

 private:
  struct Retired {
    char* data;
    size_t bytes;
    cudaEvent_t copiesDone;  // behind every copy queued on it
  };
  // cudaFreeHost synchronizes the whole device: on the op's thread it would
  // make the collective wait for work the user queued after it. A thread of
  // the buffer's own frees an outgrown buffer once the stream's copies on it
  // are done.
  void retire(char* data, size_t bytes);
  void freeRetired();

  int device_;
  cudaStream_t stream_;
  StagingSizer sizer_;
  char* data_ = nullptr;
  std::atomic<size_t> capacity_{0};
  std::mutex mu_;
  std::vector<Retired> retired_;  // under mu_
  std::atomic<size_t> retiredBytes_{0};
  std::thread freer_;
  std::atomic<bool> freerIdle_{true};
};

}  // namespace smdccl
