#include "backend/cuda/cuda_completion.h"

#include <thread>

#include <c10/util/Exception.h>

#include "backend/torch_error.h"
#include "common/calls_in_flight.h"

namespace smdccl {

bool CudaCompletion::done() const {
  if (!end_->recorded.load(std::memory_order_acquire)) return false;
  if (end_->recordError != cudaSuccess || end_->failure->failed.load(std::memory_order_acquire)) return true;  // wait() raises it
  c10::cuda::CUDAGuard guard(device_);
  CaptureSafeScope captureSafe;
  // An error other than "not ready" is as done as it gets: wait() raises it.
  return queried(cudaEventQuery(end_->event)) != cudaErrorNotReady;
}

void CudaCompletion::blockCurrentStream(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  // With a timeout given, it bounds this wait. Without one, the op's own
  // deadline (the group timeout from when it started) bounds it, and the
  // progress thread records the event also when the op fails: the limit
  // below, counted from the op's start, only guards against that thread
  // being gone. Time spent queued behind earlier ops does not count (each
  // of those has its deadline too).
  const bool given = timeout.count() > 0;
  const int64_t limitNs = given ? durationNs(timeout) : timeoutNs_ + 1'000'000'000;
  const int64_t waitStartNs = steadyNowNs();
  while (!end_->recorded.load(std::memory_order_acquire)) {
    int64_t since = given ? waitStartNs : end_->startedNs.load(std::memory_order_acquire);
    if (since > 0 && steadyNowNs() - since >= limitNs) {
      // A CUDA call that never returned is what held it: name it.
      std::string calls = callsInFlight();
      C10_THROW_ERROR(
          DistBackendError,
          strCat("smdccl: ", what_(), " was not queued on the GPU within ", limitNs / 1000000,
                 given ? " ms given to wait()" : " ms of its start (the group timeout)",
                 calls.empty() ? "" : "; smdccl's CUDA calls still running: " + calls));
    }
    if (Clock::now() - start < std::chrono::microseconds(200)) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
  TORCH_CHECK(end_->recordError == cudaSuccess, "smdccl: could not mark the end of ", what_(),
              " on the GPU: ", cudaGetErrorString(end_->recordError));
  c10::cuda::CUDAGuard guard(device_);
  CaptureSafeScope captureSafe;
  cudaStream_t cur = c10::cuda::getCurrentCUDAStream(device_).stream();
  cudaError_t e = cudaStreamWaitEvent(cur, end_->event, 0);
  TORCH_CHECK(e == cudaSuccess, "smdccl: could not order the current stream after ", what_(), ": ",
              cudaGetErrorString(e));
}

std::exception_ptr CudaCompletion::error() const {
  if (end_->failure->failed.load(std::memory_order_acquire))
    return toTorchError(
        std::make_exception_ptr(CommError(CommError::Kind::Timeout, end_->failure->message)));
  if (!end_->recorded.load(std::memory_order_acquire)) return nullptr;
  // What done() takes for done and wait() raises: the end mark could not be
  // recorded, or the GPU work behind it failed (a sticky CUDA error).
  cudaError_t e = end_->recordError;
  if (e == cudaSuccess) {
    c10::cuda::CUDAGuard guard(device_);
    CaptureSafeScope captureSafe;
    e = queried(cudaEventQuery(end_->event));
    if (e == cudaErrorNotReady) return nullptr;
  }
  if (e == cudaSuccess) return nullptr;
  return toTorchError(std::make_exception_ptr(CommError(
      CommError::Kind::System,
      strCat("smdccl: ", what_(), ": its GPU work failed (", cudaGetErrorString(e), ")"))));
}

}  // namespace smdccl
