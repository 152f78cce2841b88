#include "transport/cuda/stream_watch.h"

#include <chrono>

#include "common/error.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/event_pool.h"

namespace smdccl {

StreamWatch::StreamWatch(int device, Hooks hooks)
    : device_(device), hooks_(std::move(hooks)), thread_([this] { loop(); }) {}

StreamWatch::~StreamWatch() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  for (const Watched& w : watched_) EventPool::give(device_, w.event);
}

void StreamWatch::watch(cudaStream_t stream, Deadline deadline, std::function<std::string()> what,
                        std::vector<std::shared_ptr<WatchedFailure>> failures) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_) {
    tellFailed(failures, why_);
    return;
  }
  cudaEvent_t e = EventPool::take(device_);
  cudaError_t r = cudaEventRecord(e, stream);
  if (r != cudaSuccess) {
    EventPool::give(device_, e);
    throwCudaError(r, "cudaEventRecord (watching NCCL's work)");
  }
  watched_.push_back({e, deadline, std::move(what), std::move(failures)});
  cv_.notify_all();
}

void StreamWatch::failAll(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!failed_) {
    failed_ = true;
    why_ = why;
  }
  // On the caller's thread, whatever its device (an event is queried from
  // any): a work that finished before the abort keeps its success.
  for (const Watched& w : watched_) {
    const cudaError_t e = cudaEventQuery(w.event);
    if (e == cudaErrorNotReady) (void)cudaGetLastError();  // not the caller's error
    if (e != cudaSuccess) tellFailed(w.failures, why_);
  }
}

std::string StreamWatch::checkOldest(bool* done) {
  *done = false;
  const Watched& w = watched_.front();
  // Not counted in gCudaCalls: the polls are the watch's, not the op's.
  cudaError_t e = cudaEventQuery(w.event);
  if (e == cudaErrorNotReady) (void)cudaGetLastError();
  if (e == cudaSuccess) {
    *done = true;
    return "";
  }
  if (e != cudaErrorNotReady)
    return strCat("smdccl: ", w.what(), ": its GPU work failed (", cudaGetErrorString(e), ")");
  if (w.deadline.expired())
    return strCat("smdccl: ", w.what(),
                  ": NCCL's work inside the node did not finish within the group timeout (a "
                  "node-mate may be gone, stalled, or running other collectives)");
  return "";
}

void StreamWatch::loop() {
  cudaSetDevice(device_);
  CaptureSafeScope captureSafe;  // a user's graph capture on another thread is not disturbed
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (watched_.empty() || failed_) {
      cv_.wait(lock, [&] { return stop_ || (!watched_.empty() && !failed_); });
      continue;
    }
    bool done = false;
    std::string why = checkOldest(&done);
    if (done) {
      EventPool::give(device_, watched_.front().event);
      watched_.pop_front();
      continue;
    }
    if (why.empty() && hooks_.probe) why = hooks_.probe();
    if (!why.empty()) {
      failed_ = true;
      why_ = why;
      for (const Watched& w : watched_) tellFailed(w.failures, why);
      auto failed = hooks_.failed;
      lock.unlock();  // the handler may abort NCCL or fail the group: not under the lock
      if (failed) failed(why);
      lock.lock();
      continue;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(2));
  }
}

}  // namespace smdccl
