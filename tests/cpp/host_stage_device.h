#pragma once
// A StageDevice whose memory is host memory: copies are memcpy, the wire
// casts are the CPU kernels (the ones the exchange uses for host tensors).
// It stands in for the GPU where there is none, so that the staged
// schedules (slots, ordering, packing, failures, byte counts) run in CI.
//
// Modes:
//  - Immediate: a copy runs when it is queued.
//  - Deferred: an asynchronous device: copies wait in one queue per lane
//    and run a step at a time as done() is polled, so the proxy sees work
//    still pending and must not touch a slot before its copy is done.
#include <cstdint>
#include <deque>

#include "algorithms/stage_device.h"

namespace smdccl {

class HostStageDevice final : public StageDevice {
 public:
  enum class Mode { Immediate, Deferred };
  explicit HostStageDevice(Mode mode = Mode::Immediate) : mode_(mode) {}

  // What `c` does, run on the host.
  static void run(const Copy& c);
  // The queued copies still run, as on a GPU.
  void abandon() override;

 protected:
  void queue(int lane, uint64_t number, const Copy& c) override;
  bool ran(int lane, uint64_t number) override;

 private:
  struct Lane {
    std::deque<Copy> pending;  // queued, not run (Deferred)
    uint64_t ran = 0;          // copies run, in order
  };
  Mode mode_;
  Lane lanes_[2];
};

}  // namespace smdccl
