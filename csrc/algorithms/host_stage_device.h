#pragma once
// A StageDevice whose memory is host memory: copies are memcpy, the wire
// casts and reductions are the CPU kernels (the ones the exchange uses for
// host tensors). It stands in for the GPU where there is none, so that the
// staged schedules (slots, ordering, failures, byte counts) run in CI.
//
// Deferred mode models an asynchronous device: work waits in one queue per
// direction (like the GPU's copy-out and copy-in streams) and runs a step
// at a time as done() is polled, so the proxy sees work still pending and
// must not touch a slot before its ticket is done.
#include <cstdint>
#include <deque>
#include <functional>

#include "algorithms/stage_device.h"

namespace smdccl {

class HostStageDevice final : public StageDevice {
 public:
  explicit HostStageDevice(bool deferred = false) : deferred_(deferred) {}
  bool done(Ticket t) override;

 protected:
  Ticket queueToHost(void* slot, const char* src, size_t count, DType dt, Wire wire) override;
  Ticket queueFromHost(char* dst, const void* slot, size_t count, const Unpack& how) override;

 private:
  struct Queue {
    std::deque<std::function<void()>> pending;
    uint64_t queued = 0, ran = 0;  // tickets issued and run, in order
  };
  Ticket queue(int q, std::function<void()> work);
  // Tickets carry their queue in the low bit.
  static int queueOf(Ticket t) { return static_cast<int>(t & 1); }
  static uint64_t numberOf(Ticket t) { return t >> 1; }

  bool deferred_;
  Queue queues_[2];  // 0: to host, 1: from host
};

}  // namespace smdccl
