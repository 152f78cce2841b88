#include "backend/progress_thread.h"

#include <pthread.h>
#include <sched.h>

#include <chrono>

#include "common/exit_fence.h"
#include "common/own_thread.h"

namespace smdccl {

namespace {
// The ProgressThread whose task this thread is running (the progress thread
// itself, or a caller running one inline), and where on this thread's stack
// it started running tasks.
thread_local ProgressThread* tlRunning = nullptr;
thread_local const char* tlStackMark = nullptr;

// Sets tlRunning (and the stack mark: this object's own address) for a scope.
class RunningHere {
 public:
  explicit RunningHere(ProgressThread* p) : prev_(tlRunning), prevMark_(tlStackMark) {
    tlRunning = p;
    tlStackMark = reinterpret_cast<const char*>(this);
  }
  ~RunningHere() {
    tlRunning = prev_;
    tlStackMark = prevMark_;
  }
  RunningHere(const RunningHere&) = delete;
  RunningHere& operator=(const RunningHere&) = delete;

 private:
  ProgressThread* prev_;
  const char* prevMark_;
};

// Bytes of stack between the running thread's mark and the caller's frame
// (stacks grow down on every platform this builds for).
size_t stackInUse() {
  char here;
  return tlStackMark ? static_cast<size_t>(tlStackMark - &here) : 0;
}
}  // namespace

const void* runningKey() { return tlRunning; }

bool ProgressThread::runningHere() const { return tlRunning == this; }

bool ProgressThread::runNowOrDefer(const void* id, std::function<void()> task) {
  if (stackInUse() < kNestedStackLimit) {
    task();
    return true;
  }
  deferred_.push_back({id, std::move(task)});
  return false;
}

void ProgressThread::runDeferred() {
  while (!deferred_.empty()) {
    auto task = std::move(deferred_.front().run);
    deferred_.pop_front();
    task();
  }
}

bool runDeferredThrough(const void* runner, const void* id) {
  ProgressThread* p = tlRunning;
  if (!p || p != runner) return false;
  bool queued = false;
  for (auto& d : p->deferred_) queued = queued || d.id == id;
  if (!queued) return false;
  while (true) {
    auto item = std::move(p->deferred_.front());
    p->deferred_.pop_front();
    item.run();
    if (item.id == id) return true;
  }
}

ProgressThread::ProgressThread(int idleSpinUs) : idleSpinUs_(idleSpinUs) {
  thread_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

bool ProgressThread::post(std::function<void()> task, std::shared_ptr<Fusable> fusable) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_.load()) return false;
    queue_.push_back({std::move(task), std::move(fusable)});
    pending_.fetch_add(1);
  }
  if (sleeping_.load()) cv_.notify_one();
  return true;
}

void ProgressThread::stopWhenIdle() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    exiting_ = true;
  }
  cv_.notify_all();
}

bool ProgressThread::tryRunInline(const std::function<void()>& task) {
  std::unique_lock<std::mutex> running(runMu_, std::try_to_lock);
  if (!running.owns_lock() || pending_.load() > 0) return false;
  RunningHere here(this);
  task();
  runDeferred();
  return true;
}

bool ProgressThread::tryPop(std::function<void()>* task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queue_.empty()) return false;
  *task = std::move(queue_.front().run);
  queue_.pop_front();
  return true;
}

size_t ProgressThread::countFusable(const std::function<bool(Fusable&)>& ok) {
  std::lock_guard<std::mutex> lock(mu_);
  size_t k = 0;
  while (k < queue_.size() && queue_[k].fusable && ok(*queue_[k].fusable)) ++k;
  return k;
}

std::vector<std::shared_ptr<Fusable>> ProgressThread::takeFusable(size_t k) {
  std::vector<std::shared_ptr<Fusable>> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < k && !queue_.empty() && queue_.front().fusable; ++i) {
      out.push_back(std::move(queue_.front().fusable));
      queue_.pop_front();
    }
  }
  pending_.fetch_sub(out.size());
  return out;
}

void ProgressThread::loop() {
  using Clock = std::chrono::steady_clock;
  pthread_setname_np(pthread_self(), "smdccl-progress");  // 15 characters: the limit
  markOwnThread();
  RunningHere here(this);
  while (true) {
    std::function<void()> task;
    // Poll briefly first: the next collective usually follows at once.
    auto until = Clock::now() + std::chrono::microseconds(idleSpinUs_);
    bool got = false;
    while (!(got = pending_.load() > 0 && tryPop(&task)) && Clock::now() < until &&
           !exiting_.load())
      sched_yield();
    if (!got) {
      std::unique_lock<std::mutex> lock(mu_);
      sleeping_ = true;
      cv_.wait(lock, [&] { return stop_ || exiting_.load() || !queue_.empty(); });
      sleeping_ = false;
      if (queue_.empty()) {  // stop requested and nothing left
        stopped_ = true;     // under mu_: no post() can slip in behind this
        return;
      }
      task = std::move(queue_.front().run);
      queue_.pop_front();
    }
    std::lock_guard<std::mutex> running(runMu_);
    task();
    runDeferred();
    pending_.fetch_sub(1);
    dropOrLeak(task);  // it may hold the last reference to Python's tensors
  }
}

}  // namespace smdccl
