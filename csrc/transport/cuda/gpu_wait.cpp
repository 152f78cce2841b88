#include "transport/cuda/gpu_wait.h"

#include <sched.h>

#include <chrono>
#include <thread>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// `timedOut` builds the message of the Timeout thrown past `deadline`.
template <typename Query, typename Message>
void pollUntilDone(Query query, Deadline deadline, Message timedOut, const char* what) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  for (uint64_t i = 0;; ++i) {
    cudaError_t e = query();
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) throwCudaError(e, what);
    if ((i & 63) == 0 && deadline.expired()) throw CommError(CommError::Kind::Timeout, timedOut());
    auto waited = Clock::now() - start;
    if (waited < std::chrono::microseconds(50)) continue;
    if (waited < std::chrono::milliseconds(2)) sched_yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

std::string inOp(const OpContext& ctx, const char* what) {
  return strCat("smdccl: ", ctx.describe(), ": timed out waiting for the GPU (", what, ")");
}

}  // namespace

void waitForEvent(cudaEvent_t ev, const OpContext& ctx, const char* what) {
  pollUntilDone([ev] { return cudaEventQuery(ev); }, ctx.deadline, [&] { return inOp(ctx, what); },
                what);
}

void waitForStream(cudaStream_t s, const OpContext& ctx, const char* what) {
  pollUntilDone([s] { return cudaStreamQuery(s); }, ctx.deadline, [&] { return inOp(ctx, what); },
                what);
}

void waitForEvent(cudaEvent_t ev, Deadline deadline, const std::string& what) {
  pollUntilDone([ev] { return cudaEventQuery(ev); }, deadline,
                [&] { return strCat("smdccl: timed out waiting for the GPU (", what, ")"); },
                what.c_str());
}

}  // namespace smdccl
