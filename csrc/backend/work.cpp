#include "backend/work.h"

#include <sched.h>

#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>

namespace smdccl {

namespace {
c10::intrusive_ptr<c10::ivalue::Future> newTensorListFuture() {
  static const c10::TypePtr type = c10::ListType::create(c10::TensorType::get());
  return c10::make_intrusive<c10::ivalue::Future>(type);
}
}  // namespace

SmdcclWork::SmdcclWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs,
                       std::function<std::string()> what)
    : ::c10d::Work(rank, type), outputs_(std::move(outputs)), what_(std::move(what)) {}

bool SmdcclWork::isCompleted() { return done_.load(std::memory_order_acquire); }

bool SmdcclWork::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_.load() && !exception_;
}

std::exception_ptr SmdcclWork::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
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
    else future->markCompleted(c10::IValue(outputs_));
  }
}

bool SmdcclWork::wait(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
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
    } else if (!cv_.wait_for(lock, timeout, ready)) {
      C10_THROW_ERROR(DistBackendError,
                      "smdccl " + what_() + " did not complete within " +
                          std::to_string(timeout.count()) + " ms given to wait()");
    }
  }
  if (auto e = exception()) std::rethrow_exception(e);
  return true;
}

std::vector<at::Tensor> SmdcclWork::result() { return outputs_; }

c10::intrusive_ptr<c10::ivalue::Future> SmdcclWork::getFuture() {
  bool completeNow = false;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      future_ = newTensorListFuture();
      completeNow = done_.load();
    }
    future = future_;
  }
  if (completeNow) {
    if (exception_) future->setError(exception_);
    else future->markCompleted(c10::IValue(outputs_));
  }
  return future;
}

float SmdcclWork::getDuration() const {
  if (!done_.load()) return -1.f;
  return std::chrono::duration<float, std::milli>(finished_ - started_).count();
}

}  // namespace smdccl
