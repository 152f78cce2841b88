#pragma once
// Page-locked host memory for staging CUDA tensors through the host
// transports (TCP, shared memory): the GPU copies into and out of it
// asynchronously. Grows on demand; its user orders reuse with the stream
// that copies (every copy into it is on that one stream).
#include <cstddef>
#include <vector>

namespace smdccl {

class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes` long. Contents are lost when it grows; the caller must
  // have no copy in flight on it then.
  char* reserve(size_t bytes);

 private:
  char* data_ = nullptr;
  size_t capacity_ = 0;
  // Outgrown buffers, freed with this one: cudaFreeHost synchronizes the
  // whole device, which would make a collective wait for work the user
  // queued after it. Each is at most 2/3 of the next, so together they
  // hold at most twice the current size.
  std::vector<char*> retired_;
};

}  // namespace smdccl
