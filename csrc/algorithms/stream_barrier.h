#pragma once
// A barrier of a node's ranks that their device streams pass, not their
// hosts: each rank's stream writes its arrival into every node-mate's row of
// a flag matrix in shared host memory and waits until its own row shows
// every node-mate's. Queued at call time, it lets a CUDA-IPC collective be
// enqueued whole, so that the caller's thread never waits for the GPU (the
// host-driven barrier waited for each step on the host).
//
// The flags are 32-bit epochs, compared cyclically as CUDA's stream waits
// compare them ((int32_t)(flag - value) >= 0): they never need resetting.
// Torch- and CUDA-free: the queue is an interface (FlagQueue), implemented
// with CUDA stream memory operations on a GPU and, in the CI tests, by
// HostFlagQueue (tests/cpp/host_flag_queue.h, a thread).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace smdccl {

// Whether a flag holding `flag` satisfies a wait for `value` (cyclic).
inline bool flagReached(uint32_t flag, uint32_t value) {
  return static_cast<int32_t>(flag - value) >= 0;
}

// What a device stream (or its host stand-in) can do with a flag: ordered
// with the work queued on it, never blocking the caller.
class FlagQueue {
 public:
  virtual ~FlagQueue() = default;
  // Once the work queued before it has finished (its writes visible to the
  // node's other processes and devices): *flag = value.
  virtual void write(uint32_t* flag, uint32_t value) = 0;
  // The work queued after it waits until flagReached(*flag, value).
  virtual void waitFor(const uint32_t* flag, uint32_t value) = 0;
};

// The node's flag matrix, as one process maps it: slot(w, a) is where local
// rank a's arrivals reach local rank w.
struct FlagMatrix {
  char* base = nullptr;
  int localSize = 0;
  size_t stride = 64;  // bytes between slots: one cache line each
  uint32_t* slot(int waiter, int arriver) const {
    return reinterpret_cast<uint32_t*>(
        base + (static_cast<size_t>(waiter) * static_cast<size_t>(localSize) +
                static_cast<size_t>(arriver)) *
                   stride);
  }
  // After the slots: the node's verdict (StreamBarrier::giveUp), 8 bytes.
  uint64_t* verdict() const {
    return reinterpret_cast<uint64_t*>(base + static_cast<size_t>(localSize) *
                                                  static_cast<size_t>(localSize) * stride);
  }
  static size_t bytesFor(int localSize, size_t stride = 64) {
    return static_cast<size_t>(localSize) * static_cast<size_t>(localSize) * stride + stride;
  }
};

class StreamBarrier {
 public:
  // `me`: this rank's local index. Every rank of the node starts at the same
  // `epoch` (the flags hold it: zero-filled shared memory for 0).
  StreamBarrier(FlagMatrix flags, int me, uint32_t epoch = 0);

  // Queues this rank's arrival at the next barrier on q, then the wait for
  // every node-mate's; returns that barrier's epoch. Every rank of the node
  // must arrive at the same barriers in the same order.
  uint32_t arrive(FlagQueue& q);
  // The latest epoch arrive() returned.
  uint32_t lastEpoch() const { return epoch_.load(std::memory_order_acquire); }
  // Read on the host: the local ranks whose arrival at `epoch` has not
  // reached this rank's row yet (empty: the barrier is passed or passing).
  std::vector<int> missing(uint32_t epoch) const;
  // After a failure: fills this rank's row so that every wait queued so far
  // (and 2^20 barriers more) passes, so that its stream drains instead of
  // waiting for a rank that is gone. Node-mates' rows are left alone: each
  // finds its own failure. A late arrival of a node-mate overwrites its
  // slot, so call it until the stream has drained.
  void release();
  // After a failure at barrier `epoch`, before release(): tells the node.
  // A node-mate that still arrives later (slow, not gone) would pass
  // barriers this rank let pass unmet and read buffers it has moved on
  // from: its watch finds the verdict instead. The first one stays.
  void giveUp(uint32_t epoch);
  struct Verdict {
    int by = -1;  // the local rank that gave up; -1: none did
    uint32_t epoch = 0;
  };
  Verdict verdict() const;
  int localSize() const { return flags_.localSize; }
  int me() const { return me_; }

 private:
  FlagMatrix flags_;
  int me_;
  std::atomic<uint32_t> epoch_;
};

// Host side of the barriers a stream has queued: which have passed, and
// whether the oldest that has not has outlived its deadline. Thread-safe.
class BarrierWatch {
 public:
  struct Pending {
    uint32_t epoch;
    Deadline deadline;
    // Names the op and its step for the error: "allreduce #7 on group '0'
    // (one-shot reduce)"; built only on a timeout.
    std::function<std::string()> what;
  };
  void add(Pending p);
  // Drops the barriers b has passed. When the oldest left is past its
  // deadline, returns the error message, naming the op and the missing
  // ranks (`groupRank` maps a local index to the group's rank), and
  // `*epoch` is set to that barrier's; when a node-mate gave up (b's
  // verdict), the message says so and `*epoch` is its barrier's; "" otherwise.
  std::string check(const StreamBarrier& b, const std::function<int(int)>& groupRank,
                    uint32_t* epoch = nullptr);
  // Drops the barriers b has passed; false when none is left, else the
  // oldest one's epoch in *epoch.
  bool oldest(const StreamBarrier& b, uint32_t* epoch);
  size_t pending() const;

 private:
  mutable std::mutex mu_;
  std::deque<Pending> pending_;
};

}  // namespace smdccl
