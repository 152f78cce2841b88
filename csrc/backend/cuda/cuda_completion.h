#pragma once
// When a CUDA op's GPU work is done, as its Work sees it: the event behind
// the op's GPU work (OpEnd) and the DeviceCompletion that waits on it.
// c10/cuda only (see cuda_ops.cpp).
#include <cstdint>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "backend/work.h"
#include "common/steady_clock.h"
#include "transport/cuda/stream_watch.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/event_pool.h"

namespace smdccl {

// A CUDA event (timing off) on device `dev`, from the device's pool and
// back to it with this object (transport/cuda/event_pool.h): no op creates
// or destroys one. It may die on a send or receive thread, which has no
// current device: giving it back makes no CUDA call.
struct GpuEvent {
  cudaEvent_t event = nullptr;
  int device;
  explicit GpuEvent(int dev) : event(EventPool::take(dev)), device(dev) {}
  ~GpuEvent() { EventPool::give(device, event); }
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;
  // Marks the end of what is queued on device `dev`'s current stream (the
  // caller's) now.
  void recordOnCurrentStream(int dev) {
    SMDCCL_CUDA_CHECK(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(dev).stream()));
  }
};

// When an op's GPU work is all queued on the internal stream: an event
// recorded right behind it. Shared by the op (records it) and its Work
// (waits for it).
struct OpEnd : GpuEvent {
  std::atomic<bool> recorded{false};
  cudaError_t recordError = cudaSuccess;  // written before `recorded`
  // Set if the op's NCCL work failed after the op returned (GpuContext::watchNccl).
  std::shared_ptr<WatchedFailure> failure = std::make_shared<WatchedFailure>();
  // When the op started to run (steady clock, ns; 0 while it is queued).
  std::atomic<int64_t> startedNs{0};
  explicit OpEnd(int dev) : GpuEvent(dev) {}
};

// Work.wait() on CUDA tensors. The caller's stream must not wait for GPU
// work that is not queued yet: a stream blocked on a future submission can
// share a hardware queue with the internal stream and block it (seen on an
// H100 with a front-end wait and with a spinning kernel alike: the
// collective never finished). So the host waits until the progress thread
// has queued the op's GPU work, then the caller's stream waits for the
// event behind it. NCCL inside a node is queued whole, so that wait is
// short; the collectives whose steps the host drives (IPC steps at host
// barriers, staged steps, host copies) last about as long as the
// collective.
class CudaCompletion : public DeviceCompletion {
 public:
  // `what` names the op in errors ("collective #7"); `stream`: where the
  // event behind its GPU work is recorded.
  CudaCompletion(int device, c10::cuda::CUDAStream stream, std::shared_ptr<OpEnd> end,
                 std::function<std::string()> what, std::chrono::milliseconds timeout)
      : device_(device),
        stream_(stream),
        end_(std::move(end)),
        what_(std::move(what)),
        timeoutNs_(durationNs(timeout)) {}
  bool done() const override;
  void blockCurrentStream(std::chrono::milliseconds timeout) override;
  c10::Device device() const override { return c10::Device(c10::kCUDA, device_); }
  c10::Stream stream() const override { return stream_; }
  std::exception_ptr error() const override;

 private:
  int device_;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<OpEnd> end_;
  std::function<std::string()> what_;
  int64_t timeoutNs_;
};

}  // namespace smdccl
