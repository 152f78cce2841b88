#pragma once
// CUDA runtime errors as smdccl exceptions (never an abort): the backend
// turns them into the Python exception of the failing collective.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>

#include "common/error.h"

namespace smdccl {

// CUDA (and NCCL) calls smdccl made, process-wide: each checked call,
// kernel launch and status query counts one. The benchmarks read it around
// a collective: what the op costs the driver (cuda_staged_bench.py).
inline std::atomic<uint64_t> gCudaCalls{0};
inline void countCudaCall() { gCudaCalls.fetch_add(1, std::memory_order_relaxed); }

[[noreturn]] inline void throwCudaError(cudaError_t e, const char* what) {
  throw CommError(CommError::Kind::System, strCat("CUDA error in ", what, ": ", cudaGetErrorName(e),
                                                  " (", cudaGetErrorString(e), ")"));
}

// A CUDA call's result checked (and counted); `what` names the call.
inline void checkCuda(cudaError_t e, const char* what) {
  countCudaCall();
  if (e != cudaSuccess) throwCudaError(e, what);
}

// Sets the thread's device for a scope and restores the previous one at
// its end. `strict`: a failed switch throws; otherwise (cleanup that must
// not throw) the calls go to the device that is current.
struct DeviceScope {
  int prev = -1;
  explicit DeviceScope(int dev, bool strict = true) {
    cudaError_t e = cudaGetDevice(&prev);
    if (e == cudaSuccess && prev != dev) e = cudaSetDevice(dev);
    if (e != cudaSuccess && strict) throwCudaError(e, "cudaSetDevice");
  }
  ~DeviceScope() {
    int cur = -1;
    if (prev >= 0 && cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
};

// The result of a status query (cudaEventQuery, cudaStreamQuery), passed
// through. "Not ready" may linger as the thread's last error (torch clears
// it too): a later launch check (cudaGetLastError) would take it for its own.
inline cudaError_t queried(cudaError_t e) {
  countCudaCall();
  if (e == cudaErrorNotReady) (void)cudaGetLastError();
  return e;
}

}  // namespace smdccl

#define SMDCCL_CUDA_CHECK(expr) ::smdccl::checkCuda((expr), #expr)
