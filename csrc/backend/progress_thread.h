#pragma once
// The backend's own thread: runs queued collectives one at a time, in the
// order they were issued. After each task it polls for the next one a little
// (yielding the core) before sleeping, so back-to-back collectives do not pay
// a wake-up each. The thread is named "smdccl-progress" (/proc/PID/task/*/comm).
// After a failure that leaves the group unusable, stopWhenIdle() ends it
// once the queue is drained; post() then refuses new tasks.
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
// From a callback on the thread running `runner`'s tasks: runs the deferred
// tasks (runNowOrDefer) up to and including the one deferred as `id`, in
// order. False, running nothing, when `id` is not deferred here.
bool runDeferredThrough(const void* runner, const void* id);

class ProgressThread {
 public:
  explicit ProgressThread(int idleSpinUs);
  ~ProgressThread();  // runs what is queued, then stops

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
  // For a task issued by a callback while runningHere(): runs it now, unless
  // the callbacks have nested so deep (a chain of futures, each then()
  // attached to an op that completed at once) that the stack is at its
  // limit; then it is deferred (false) and runs once the running task
  // returns, before anything queued, in the order deferred. `id` names it
  // for runDeferredThrough().
  bool runNowOrDefer(const void* id, std::function<void()> task);
  // A chain link takes ~2.5 KB of stack (measured): this is ~200 links,
  // short of Python's recursion limit (RecursionError at ~500 links), far
  // short of the thread's 8 MiB, and far deeper than DDP's hooks nest.
  static constexpr size_t kNestedStackLimit = 512 << 10;
  // Identifies this thread's tasks in runningKey(); never dereferenced.
  const void* key() const { return this; }
  size_t pending() const { return pending_.load(); }

 private:
  void loop();
  struct Item {
    std::function<void()> run;
    std::shared_ptr<Fusable> fusable;
  };
  bool tryPop(std::function<void()>* task);
  void runDeferred();
  friend bool runDeferredThrough(const void* runner, const void* id);
  struct Deferred {
    const void* id;
    std::function<void()> run;
  };
  // Only the thread running a task (holding runMu_) touches it.
  std::deque<Deferred> deferred_;

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
  std::thread thread_;
};

}  // namespace smdccl
