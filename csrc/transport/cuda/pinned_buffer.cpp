#include "transport/cuda/pinned_buffer.h"

#include <utility>

#include "common/own_thread.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/event_pool.h"
#include "common/calls_in_flight.h"

namespace smdccl {

PinnedBuffer::PinnedBuffer(int device, cudaStream_t stream, int shrinkWindow)
    : device_(device), stream_(stream), sizer_(shrinkWindow) {}

PinnedBuffer::~PinnedBuffer() {
  if (freer_.joinable()) freer_.join();
  // The group's stream is idle by now (its owner synchronized it).
  for (Retired& r : retired_) {
    if (!r.copiesDone) continue;
    cudaEventSynchronize(r.copiesDone);
    EventPool::give(device_, r.copiesDone);
  }
  for (Retired& r : retired_) cudaFreeHost(r.data);
  if (data_) cudaFreeHost(data_);
}

char* PinnedBuffer::reserve(size_t bytes) {
  size_t have = capacity_.load();
  size_t want = sizer_.fit(have, bytes);
  if (want == have) return data_;
  if (data_) retire(data_, have);
  data_ = nullptr;
  capacity_ = 0;
  void* p = nullptr;
  CallInFlight call("cudaHostAlloc of the pinned staging buffer");
  SMDCCL_CUDA_CHECK(cudaHostAlloc(&p, want, cudaHostAllocPortable));
  data_ = static_cast<char*>(p);
  capacity_ = want;
  return data_;
}

void PinnedBuffer::retire(char* data, size_t bytes) {
  cudaEvent_t done = EventPool::take(device_);
  if (cudaEventRecord(done, stream_) != cudaSuccess) {
    // No way to know when its copies end: keep it for the destructor,
    // which runs after the stream is synchronized.
    EventPool::give(device_, done);
    (void)cudaGetLastError();
    done = nullptr;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back({data, bytes, done});
    retiredBytes_ += bytes;
  }
  if (!done || !freerIdle_.load()) return;  // the running freer takes it
  if (freer_.joinable()) freer_.join();
  freerIdle_ = false;
  freer_ = std::thread([this] { freeRetired(); });
}

void PinnedBuffer::freeRetired() {
  markOwnThread();
  // A thread has no current device: without this the CUDA calls below
  // would create a context on GPU 0 for every rank.
  if (cudaSetDevice(device_) != cudaSuccess) {
    std::lock_guard<std::mutex> lock(mu_);  // the destructor frees them
    freerIdle_ = true;
    return;
  }
  // Our calls must not break a graph capture running on a user's thread.
  CaptureSafeScope captureSafe;
  for (;;) {
    Retired r{};
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = retired_.begin();
      while (it != retired_.end() && !it->copiesDone) ++it;
      if (it == retired_.end()) {
        freerIdle_ = true;
        return;
      }
      r = *it;
      retired_.erase(it);
    }
    cudaEventSynchronize(r.copiesDone);
    EventPool::give(device_, r.copiesDone);
    CallInFlight call("cudaFreeHost of an outgrown pinned staging buffer");
    cudaFreeHost(r.data);
    retiredBytes_ -= r.bytes;
  }
}

}  // namespace smdccl
