#pragma once
// A gate in a device stream that the host opens: hold() queues a wait on a
// flag, release() (a host store) lets the stream's work behind it go. A
// collective that runs on the host between a copy in and a copy out queues
// both copies, with the gate between them, before it runs: the caller's
// stream can then wait for the copy out at once, and the host never waits
// for the GPU after the copy in.
//
// Only work queued before hold() may be waited for by whoever releases the
// gate: work queued behind it, on this stream or on one that shares its
// hardware queue, may wait for the gate. Torch- and CUDA-free (FlagQueue).
#include <cstdint>

#include "algorithms/stream_barrier.h"

namespace smdccl {

class StreamGate {
 public:
  // `flag`: memory the queue's device and this host see (zero at first).
  explicit StreamGate(uint32_t* flag) : flag_(flag) {}
  // Queues on q a wait that holds q's later work until release() of the
  // ticket it returns (or of a later one).
  uint32_t hold(FlagQueue& q);
  // Opens the gate `ticket`, and every one held before it.
  void release(uint32_t ticket);
  // Opens every gate held so far (a context that goes away).
  void releaseAll() { release(held_); }
  // Whether `ticket` has been released.
  bool released(uint32_t ticket) const;

 private:
  uint32_t* flag_;
  uint32_t held_ = 0;
};

}  // namespace smdccl
