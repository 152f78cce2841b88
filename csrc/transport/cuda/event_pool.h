#pragma once
// CUDA handles of a device reused across ops and groups, never destroyed.
// Events (timing off): an op takes the ones it records and gives them back
// when it is done with them, so that no collective creates or destroys an
// event (each a driver call, and cudaEventDestroy may take the driver's
// lock while the GPU is busy); the pool only grows to the most in use at
// once. Streams: backend/cuda/internal_streams.h. Thread-safe.
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <vector>

namespace smdccl {

// Idle handles of type H per device.
template <typename H>
class HandlePool {
 public:
  // One of `device`'s idle handles, or nullptr.
  static H take(int device) {
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    std::vector<H>& idle = s.idle[device];
    if (idle.empty()) return nullptr;
    H h = idle.back();
    idle.pop_back();
    return h;
  }
  static void give(int device, H h) noexcept {
    if (!h) return;
    State& s = state();
    std::lock_guard<std::mutex> lock(s.mu);
    s.idle[device].push_back(h);
  }

 private:
  struct State {
    std::mutex mu;
    std::map<int, std::vector<H>> idle;
  };
  static State& state() {
    static auto* s = new State;  // never destroyed: handles come back during exit too
    return *s;
  }
};

class EventPool {
 public:
  // An event of `device` (the current device is switched to it only when a
  // new one must be created). Throws CommError if CUDA cannot make one.
  static cudaEvent_t take(int device);
  // Back to `device`'s pool; no CUDA call.
  static void give(int device, cudaEvent_t e) noexcept { HandlePool<cudaEvent_t>::give(device, e); }
};

}  // namespace smdccl
