#include "backend/progress_thread.h"

#include <cstdint>
#include <ctime>

#include <sched.h>

#include <chrono>

#include "common/exit_fence.h"
#include "common/own_thread.h"

namespace smdccl {

namespace {
// The ProgressThread whose task this thread is running (the progress thread
// itself, or a caller running one inline).
thread_local const ProgressThread* tlRunning = nullptr;
// How many tasks this thread runs from inside another's completion callback.
thread_local int tlNested = 0;

// Sets tlRunning for a scope.
class RunningHere {
 public:
  explicit RunningHere(const ProgressThread* p) : prev_(tlRunning) { tlRunning = p; }
  ~RunningHere() { tlRunning = prev_; }
  RunningHere(const RunningHere&) = delete;
  RunningHere& operator=(const RunningHere&) = delete;

 private:
  const ProgressThread* prev_;
};
}  // namespace

const void* runningKey() { return tlRunning; }

bool ProgressThread::runningHere() const { return tlRunning == this; }

void ProgressThread::runNested(const std::function<void()>& task) {
  ++tlNested;
  struct Leave {
    ~Leave() { --tlNested; }
  } leave;
  task();
}

bool ProgressThread::runningNested() const { return runningHere() && tlNested > 0; }

ProgressThread::ProgressThread(int idleSpinUs) : idleSpinUs_(idleSpinUs) {
  thread_ = std::thread([this] { loop(); });
}

ProgressThread::~ProgressThread() { finish(); }

void ProgressThread::finish() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
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
  markOwnThread("smdccl-progress");
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
    pending_.fetch_sub(1);
    dropOrLeak(task);  // it may hold the last reference to Python's tensors
    timespec cpu{};
    if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu) == 0)
      cpuNs_.store(static_cast<uint64_t>(cpu.tv_sec) * 1000000000ull +
                   static_cast<uint64_t>(cpu.tv_nsec));
  }
}

}  // namespace smdccl
