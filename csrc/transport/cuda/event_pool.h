#pragma once
// CUDA events (timing off) of a device, reused across ops: an op takes the
// ones it records and gives them back when it is done with them, so that no
// collective creates or destroys an event (each a driver call, and
// cudaEventDestroy may take the driver's lock while the GPU is busy). The
// pool only grows to the most events in use at once; they live as long as
// the process. Thread-safe.
#include <cuda_runtime_api.h>

namespace smdccl {

class EventPool {
 public:
  // An event of `device` (the current device is switched to it only when a
  // new one must be created). Throws CommError if CUDA cannot make one.
  static cudaEvent_t take(int device);
  // Back to `device`'s pool; no CUDA call.
  static void give(int device, cudaEvent_t e) noexcept;
};

}  // namespace smdccl
