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
//  - Lagging: Deferred, and a copy back (lane 1) runs only at the
//    kLagPolls-th poll that finds it first in its queue, as a copy queued
//    behind other GPU work does: the proxy must not reuse a slot whose
//    copy back has not read it yet.
#include <cstdint>
#include <deque>

#include "algorithms/stage_device.h"

namespace smdccl {

class HostStageDevice final : public StageDevice {
 public:
  enum class Mode { Immediate, Deferred, Lagging };
  static constexpr int kModes = 3;
  static constexpr int kLagPolls = 4;
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
    int polls = 0;             // polls that found the first pending copy not yet run (Lagging)
  };
  Mode mode_;
  Lane lanes_[2];
};

}  // namespace smdccl
