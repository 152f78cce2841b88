#include "host_flag_queue.h"

#include <atomic>
#include <chrono>

namespace smdccl {

HostFlagQueue::HostFlagQueue() : thread_([this] { loop(); }) {}

HostFlagQueue::~HostFlagQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostFlagQueue::write(uint32_t* flag, uint32_t value) {
  run([flag, value] {
    // Release: what the queue ran before is visible before the flag.
    reinterpret_cast<std::atomic<uint32_t>*>(flag)->store(value, std::memory_order_release);
  });
}

void HostFlagQueue::waitFor(const uint32_t* flag, uint32_t value) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back([flag, value] {
    return flagReached(
        reinterpret_cast<const std::atomic<uint32_t>*>(flag)->load(std::memory_order_acquire),
        value);
  });
  cv_.notify_all();
}

void HostFlagQueue::run(std::function<void()> work) {
  std::lock_guard<std::mutex> lock(mu_);
  items_.push_back([w = std::move(work)] {
    w();
    return true;
  });
  cv_.notify_all();
}

bool HostFlagQueue::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.empty() && !busy_;
}

bool HostFlagQueue::drain(Deadline deadline) const {
  std::unique_lock<std::mutex> lock(mu_);
  auto done = [this] { return items_.empty() && !busy_; };
  if (deadline.at() == Deadline::Clock::time_point::max()) {
    cv_.wait(lock, done);
    return true;
  }
  return cv_.wait_until(lock, deadline.at(), done);
}

void HostFlagQueue::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || !items_.empty(); });
    if (stop_) return;
    std::function<bool()> item = std::move(items_.front());
    items_.pop_front();
    busy_ = true;
    lock.unlock();
    // A wait polls, as a stream's front end does; it backs off to a sleep.
    for (int spins = 0; !item(); ++spins) {
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      else std::this_thread::yield();
      std::lock_guard<std::mutex> check(mu_);
      if (stop_) return;
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

}  // namespace smdccl
