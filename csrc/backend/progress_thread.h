#pragma once
// The backend's own thread: runs queued collectives one at a time, in the
// order they were issued. After each task it polls for the next one a little
// (yielding the core) before sleeping, so back-to-back collectives do not pay
// a wake-up each. The thread is named "smdccl-progress" (/proc/PID/task/*/comm).
// After a failure that leaves the group unusable, stopWhenIdle() ends it
// once the queue is drained; post() then refuses new tasks.
#include <cstdint>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace smdccl {

// What a queued task carries when a running task may take it over (tensor
// fusion): the backend's own subclass.
struct Fusable {
  virtual ~Fusable() = default;
};

class ProgressThread;
// The key() of the ProgressThread whose task the calling thread is running;
// nullptr when it runs none.
const void* runningKey();

class ProgressThread {
 public:
  explicit ProgressThread(int idleSpinUs);
  ~ProgressThread();  // finish()
  // Runs what is queued, then stops the thread and joins it. The object
  // stays usable meanwhile: a task may still call stopWhenIdle() or post().
  void finish();

  // Queues `task`; false, without queueing it, once the thread has stopped
  // (stopWhenIdle): the caller must then run it itself.
  bool post(std::function<void()> task, std::shared_ptr<Fusable> fusable = nullptr);
  // Lets the thread run what is queued, then exit. Callable from a task.
  void stopWhenIdle();
  // False once the thread has exited after stopWhenIdle().
  bool running() const { return !stopped_.load(); }
  // For the running task: how many tasks at the head of the queue are
  // fusable and accepted by `ok` (called in order, stops at the first no),
  // and taking the first k of them (they will not run on their own).
  size_t countFusable(const std::function<bool(Fusable&)>& ok);
  std::vector<std::shared_ptr<Fusable>> takeFusable(size_t k);
  // Runs `task` on the calling thread if nothing is queued or running (the
  // caller is about to block on it anyway: this saves two thread hand-offs
  // and keeps issue order). Returns false, without running it, otherwise.
  bool tryRunInline(const std::function<void()>& task);
  // The calling thread is running one of this thread's tasks (on it, or
  // inline): it is in a callback that a task's completion runs (DDP's comm
  // hooks chain them on futures).
  bool runningHere() const;
  // Runs `task` at once on the calling thread, which runningHere(): a task
  // issued by a completion callback, ahead of what is queued.
  void runNested(const std::function<void()>& task);
  // The calling thread runs a task from runNested (inside a callback).
  bool runningNested() const;
  // The calling thread is this object's own thread (not a caller running a
  // task inline, while the thread may pop the queue beside it).
  bool onOwnThread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Identifies this thread's tasks in runningKey(); never dereferenced.
  const void* key() const { return this; }
  size_t pending() const { return pending_.load(); }
  // CPU time this thread has used (its clock, read after each task it ran).
  double cpuSeconds() const { return static_cast<double>(cpuNs_.load()) * 1e-9; }

 private:
  void loop();
  struct Item {
    std::function<void()> run;
    std::shared_ptr<Fusable> fusable;
  };
  bool tryPop(std::function<void()>* task);

  int idleSpinUs_;
  std::mutex mu_;
  std::mutex runMu_;  // held while a task runs, on either thread
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::atomic<size_t> pending_{0};
  std::atomic<bool> sleeping_{false};
  bool stop_ = false;
  std::atomic<bool> exiting_{false};  // stopWhenIdle() was called
  std::atomic<bool> stopped_{false};  // set under mu_, with the queue empty
  std::atomic<uint64_t> cpuNs_{0};
  std::thread thread_;
};

}  // namespace smdccl
