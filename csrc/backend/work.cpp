#include "backend/work.h"

#include "backend/progress_thread.h"

#include <sched.h>

#include <ATen/core/ivalue.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

namespace smdccl {

namespace {
// A future of the outputs, or (perList > 0) of lists of perList outputs each.
c10::intrusive_ptr<c10::ivalue::Future> newOutputsFuture(const DeviceCompletion* device,
                                                         size_t perList) {
  static const c10::TypePtr flat = c10::ListType::create(c10::TensorType::get());
  static const c10::TypePtr nested = c10::ListType::create(flat);
  const c10::TypePtr& type = perList ? nested : flat;
  // A CUDA-aware future: completed while the internal stream is current, it
  // records an event there; wait() and then() make the user's stream wait on it.
  if (device)
    return c10::make_intrusive<c10::ivalue::Future>(type,
                                                    std::vector<c10::Device>{device->device()});
  return c10::make_intrusive<c10::ivalue::Future>(type);
}
c10::IValue outputsValue(const std::vector<at::Tensor>& outputs, size_t perList) {
  if (!perList) return c10::IValue(outputs);
  std::vector<std::vector<at::Tensor>> lists;
  for (size_t at = 0; at < outputs.size(); at += perList)
    lists.emplace_back(outputs.begin() + static_cast<std::ptrdiff_t>(at),
                       outputs.begin() + static_cast<std::ptrdiff_t>(at + perList));
  return c10::IValue(lists);
}
}  // namespace

// Completes a CUDA work's future with the internal stream current, so the
// future's events follow the op's GPU work.
void SmdcclWork::markDone(c10::ivalue::Future& f) const {
  if (!device_) {
    f.markCompleted(outputsValue(outputs_, perList_));
    return;
  }
  c10::StreamGuard guard(device_->stream());
  f.markCompleted(outputsValue(outputs_, perList_));
}

SmdcclWork::SmdcclWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs,
                       std::function<std::string()> what)
    : ::c10d::Work(rank, type), outputs_(std::move(outputs)), what_(std::move(what)) {}

bool SmdcclWork::isCompleted() {
  if (!done_.load(std::memory_order_acquire)) return false;
  return !device_ || exception() || device_->done();
}

bool SmdcclWork::isSuccess() const { return done_.load() && !exception(); }

std::exception_ptr SmdcclWork::exception() const {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_ || !done_.load()) return exception_;
  }
  return device_ ? device_->error() : nullptr;
}

void SmdcclWork::markStarted() { started_ = std::chrono::steady_clock::now(); }

void SmdcclWork::complete(std::exception_ptr error) {
  finished_ = std::chrono::steady_clock::now();
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    exception_ = error;
    completed_ = true;
    done_.store(true, std::memory_order_release);
    future = future_;
  }
  cv_.notify_all();
  // Future callbacks (DDP's) run here, on the completing thread.
  if (future) {
    if (error) future->setError(error);
    else markDone(*future);
  }
}

int SmdcclWork::sourceRank() const {
  int r = sourceRank_.load(std::memory_order_acquire);
  TORCH_CHECK(r >= 0,
              "smdccl: this work has no source rank (a recv has one: from a named rank at "
              "once, from any source once it has completed)");
  return r;
}

bool SmdcclWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  const auto waitStart = Clock::now();
  if (!done_.load(std::memory_order_acquire) && runner_ && runner_ == runningKey())
    C10_THROW_ERROR(DistBackendError,
                    "smdccl: wait() for " + what_() +
                        " from a callback on the thread that runs the group's ops, before "
                        "that op ran: it is queued behind the callback and would never run. "
                        "Wait for it outside the callback, or chain it with "
                        "get_future().then()");
  if (device_) {
    // The caller's current stream waits for the collective's GPU work (see
    // DeviceCompletion). The progress thread records the event that waits
    // on just before it marks the work done, with its error if it failed:
    // the wait below for that mark is short, and a failure is never
    // returned as a success.
    if (auto e = exception()) std::rethrow_exception(e);
    device_->blockCurrentStream(timeout);
  }
  if (!done_.load(std::memory_order_acquire)) {
    // Most collectives finish within microseconds: poll (yielding the core
    // to the progress thread) before paying for a sleep and a wake-up.
    auto pollUntil = Clock::now() + std::chrono::microseconds(200);
    while (!done_.load(std::memory_order_acquire) && Clock::now() < pollUntil) sched_yield();
  }
  if (!done_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(mutex_);
    auto ready = [&] { return done_.load(std::memory_order_acquire); };
    if (timeout <= std::chrono::milliseconds(0)) {  // torch's kNoTimeout
      cv_.wait(lock, ready);
    } else if (!cv_.wait_until(lock, waitStart + timeout, ready)) {  // one budget for both waits
      C10_THROW_ERROR(DistBackendError, "smdccl " + what_() + " did not complete within " +
                                            std::to_string(timeout.count()) +
                                            " ms given to wait()");
    }
  }
  if (auto e = exception()) std::rethrow_exception(e);
  return true;
}

void SmdcclWork::synchronize() {
  if (device_) device_->blockCurrentStream(std::chrono::milliseconds(0));
}

std::vector<at::Tensor> SmdcclWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> SmdcclWork::getFuture() {
  bool completeNow = false;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      future_ = newOutputsFuture(device_.get(), perList_);
      completeNow = done_.load();
    }
    future = future_;
  }
  if (completeNow) {
    if (exception_) future->setError(exception_);
    else markDone(*future);
  }
  return future;
}

float SmdcclWork::getDuration() const {
  if (!done_.load()) return -1.f;
  return std::chrono::duration<float, std::milli>(finished_ - started_).count();
}

}  // namespace smdccl
