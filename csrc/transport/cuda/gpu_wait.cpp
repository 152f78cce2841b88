#include "transport/cuda/gpu_wait.h"

#include <sched.h>

#include <chrono>
#include <thread>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

template <typename Query>
void pollUntilDone(Query query, const OpContext& ctx, const char* what) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  for (uint64_t i = 0;; ++i) {
    cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) throwCudaError(e, what);
    if ((i & 63) == 0 && ctx.deadline.expired())
      throw CommError(CommError::Kind::Timeout,
                      strCat("smdccl: ", ctx.describe(), ": timed out waiting for the GPU (",
                             what, ")"));
    auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(2)) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

void waitForEvent(cudaEvent_t ev, const OpContext& ctx, const char* what) {
  pollUntilDone([ev] { return cudaEventQuery(ev); }, ctx, what);
}

void waitForStream(cudaStream_t s, const OpContext& ctx, const char* what) {
  pollUntilDone([s] { return cudaStreamQuery(s); }, ctx, what);
}

}  // namespace smdccl
