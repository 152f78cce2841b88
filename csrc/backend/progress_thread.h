#pragma once
// The backend's own thread: runs queued collectives one at a time, in the
// order they were issued. After each task it polls for the next one a little
// (yielding the core) before sleeping, so back-to-back collectives do not pay
// a wake-up each.
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace smdccl {

class ProgressThread {
 public:
  explicit ProgressThread(int idleSpinUs);
  ~ProgressThread();  // runs what is queued, then stops

  void post(std::function<void()> task);
  // Runs `task` on the calling thread if nothing is queued or running (the
  // caller is about to block on it anyway: this saves two thread hand-offs
  // and keeps issue order). Returns false, without running it, otherwise.
  bool tryRunInline(const std::function<void()>& task);
  size_t pending() const { return pending_.load(); }

 private:
  void loop();
  bool tryPop(std::function<void()>* task);

  int idleSpinUs_;
  std::mutex mu_;
  std::mutex runMu_;  // held while a task runs, on either thread
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::atomic<size_t> pending_{0};
  std::atomic<bool> sleeping_{false};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace smdccl
