#pragma once
// A StageDevice whose memory is host memory: copies are memcpy, the wire
// casts and reductions are the CPU kernels (the ones the exchange uses for
// host tensors). It stands in for the GPU where there is none, so that the
// staged schedules (slots, ordering, gates, failures, byte counts) run in CI.
//
// Modes:
//  - Immediate: a copy runs when go() lets it.
//  - Deferred: an asynchronous, ungated device: copies wait in one queue
//    per lane and run a step at a time as done() is polled, so the proxy
//    sees work still pending and must not touch a slot before its copy is done.
//  - Gated: the GPU's gated mode: each lane is a thread (HostFlagQueue)
//    that runs every planned copy as soon as its gate opens, concurrently
//    with the proxy, as the GPU's two copy streams do.
//  - GatedOneQueue: the same with both lanes on one thread, as when the two
//    streams share one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1): a
//    closed gate then holds both lanes, so a plan order that needs a later
//    copy before an earlier one deadlocks here as it would on the GPU.
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>

#include "algorithms/gated_lane.h"
#include "algorithms/host_flag_queue.h"
#include "algorithms/stage_device.h"

namespace smdccl {

class HostStageDevice final : public StageDevice {
 public:
  enum class Mode { Immediate, Deferred, Gated, GatedOneQueue };
  explicit HostStageDevice(Mode mode = Mode::Immediate);
  // Gated: lets every planned copy run, then stops the lanes.
  ~HostStageDevice() override;
  HostStageDevice(const HostStageDevice&) = delete;
  HostStageDevice& operator=(const HostStageDevice&) = delete;
  bool gated() const override { return mode_ == Mode::Gated || mode_ == Mode::GatedOneQueue; }

  // What `c` does, run on the host.
  static void run(const Copy& c);

 protected:
  void planned(int lane, uint64_t number, const Copy& c) override;
  void release(int lane, uint64_t number) override;
  bool ran(int lane, uint64_t number) override;
  void dropPlanned(int lane, uint64_t released, uint64_t planned) override;

 private:
  struct Lane {
    std::deque<Copy> planned;  // not released yet (ungated)
    std::deque<Copy> pending;  // released, not run (Deferred)
    uint64_t ran = 0;          // copies run, in order (ungated)
    // Gated: the thread, and the gate and progress flags.
    std::shared_ptr<HostFlagQueue> queue;
    uint32_t flags[2] = {0, 0};
    std::unique_ptr<GatedLane> gated;
  };
  Mode mode_;
  Lane lanes_[2];
};

}  // namespace smdccl
