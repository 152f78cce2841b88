#include "transport/cuda/gpu_wait.h"

#include <cstdint>
#include <sched.h>

#include <chrono>
#include <thread>

#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// `timedOut` builds the message of the Timeout thrown past `deadline`.
// Inside an op (`ctx` not null), its abort() ends the wait too.
template <typename Query, typename Message>
void pollUntilDone(Query query, Deadline deadline, Message timedOut, const char* what,
                   const OpContext* ctx = nullptr) {
  using Clock = std::chrono::steady_clock;
  CaptureSafeScope captureSafe;
  auto start = Clock::now();
  for (uint64_t i = 0;; ++i) {
    cudaError_t e = queried(query());
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) throwCudaError(e, what);
    if ((i & 63) == 0 && deadline.expired()) throw CommError(CommError::Kind::Timeout, timedOut());
    if ((i & 63) == 0 && ctx && ctx->cancel && ctx->cancel->load(std::memory_order_relaxed))
      throw CommError(
          CommError::Kind::System,
          strCat("smdccl: ", ctx->describe(),
                 ": the group was aborted on this rank (while waiting for the GPU: ", what, ")"));
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
                what, &ctx);
}

void waitForStream(cudaStream_t s, const OpContext& ctx, const char* what) {
  pollUntilDone([s] { return cudaStreamQuery(s); }, ctx.deadline, [&] { return inOp(ctx, what); },
                what, &ctx);
}

void waitForStream(cudaStream_t s, Deadline deadline, const std::string& what) {
  pollUntilDone([s] { return cudaStreamQuery(s); }, deadline,
                [&] { return strCat("smdccl: timed out waiting for the GPU (", what, ")"); },
                what.c_str());
}

}  // namespace smdccl
