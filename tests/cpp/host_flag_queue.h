#pragma once
// FlagQueue on the host: a thread that runs what is queued on it in order,
// as a device stream does. Its waits spin (then sleep) on the flag. The CI
// tests drive StreamBarrier with it between threads or processes, with host
// work (run()) where a GPU would copy and reduce.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "algorithms/stream_barrier.h"

namespace smdccl {

class HostFlagQueue : public FlagQueue {
 public:
  HostFlagQueue();
  // Stops at once: a wait in progress gives up, the rest is dropped.
  ~HostFlagQueue() override;
  HostFlagQueue(const HostFlagQueue&) = delete;
  HostFlagQueue& operator=(const HostFlagQueue&) = delete;

  void write(uint32_t* flag, uint32_t value) override;
  void waitFor(const uint32_t* flag, uint32_t value) override;
  // Host work in the queue's order (what a kernel or a copy would be).
  void run(std::function<void()> work);
  // Whether everything queued so far has run (never blocks).
  bool idle() const;
  // Blocks until idle() or `deadline`; returns idle().
  bool drain(Deadline deadline) const;

 private:
  void loop();

  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::deque<std::function<bool()>> items_;  // false: not done yet, try again
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace smdccl
