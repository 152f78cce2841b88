#pragma once
// One lane of a gated StageDevice (stage_device.h) on a FlagQueue (a device
// stream, or its host stand-in): each copy is queued behind a gate, a wait
// on a flag that release() raises, and followed by a write of its number
// to a progress flag that ran() reads. Torch- and CUDA-free.
#include <atomic>
#include <cstdint>
#include <functional>

#include "algorithms/stream_barrier.h"
#include "algorithms/stream_gate.h"

namespace smdccl {

class GatedLane {
 public:
  // `gateFlag`, `progressFlag`: memory the queue's device and this host
  // both see, zero at first, used by nothing else.
  GatedLane(FlagQueue& q, uint32_t* gateFlag, uint32_t* progressFlag)
      : q_(q), gate_(gateFlag), progress_(progressFlag) {}
  // Queues copy `number` (the lane's next): the wait for its gate,
  // `queueCopy()` (which queues the copy itself on the queue), the progress write.
  void queue(uint64_t number, const std::function<void()>& queueCopy);
  // Opens the gates of the copies up to `number`.
  void release(uint64_t number) { gate_.release(static_cast<uint32_t>(number)); }
  // Whether copy `number` has run (the flags compare cyclically).
  bool ran(uint64_t number) const {
    return flagReached(
        reinterpret_cast<const std::atomic<uint32_t>*>(progress_)->load(std::memory_order_acquire),
        static_cast<uint32_t>(number));
  }

 private:
  FlagQueue& q_;
  StreamGate gate_;
  uint32_t* progress_;
};

}  // namespace smdccl
