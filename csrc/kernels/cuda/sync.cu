// waitCounter / signalCounter (kernels.h): stream ordering across threads
// through a counter in mapped host memory, without blocking the host.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.h"

namespace smdccl::cuda {
namespace {

using namespace detail;

__device__ __forceinline__ uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void waitCounterKernel(const volatile uint64_t* counter, uint64_t target,
                                  uint64_t timeoutNs, volatile int* timedOut) {
  const uint64_t start = globalTimerNs();
  unsigned sleepNs = 32;
  while (*counter < target) {
    if (globalTimerNs() - start >= timeoutNs) {
      if (timedOut != nullptr) *timedOut = 1;
      __threadfence_system();
      return;
    }
    __nanosleep(sleepNs);
    if (sleepNs < 1024) sleepNs *= 2;  // back off: at most ~1 us between polls
  }
  // What the signaller wrote before the counter is visible to the work queued
  // after this kernel.
  __threadfence_system();
}

__global__ void signalCounterKernel(volatile uint64_t* counter, uint64_t value) {
  __threadfence_system();
  *counter = value;
  __threadfence_system();
}

// With lazy module loading, launching a kernel not yet loaded can wait for
// the device to go idle, which it does not while waitCounterKernel spins:
// if the work that signals (say a reduce on another stream) were launched
// for the first time then, it would only run after the wait timed out. So
// every kernel of this library is loaded before the first wait on a device.
cudaError_t preloadAllOnce() {
  static std::atomic<uint64_t> loaded{0};  // bit d: device d done
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const uint64_t bit = dev >= 0 && dev < 64 ? (uint64_t{1} << dev) : 0;
  if (bit != 0 && (loaded.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  preload<waitCounterKernel>(e);
  preload<signalCounterKernel>(e);
  cudaError_t r = preloadReduceKernels();
  if (e == cudaSuccess) e = r;
  r = preloadWireKernels();
  if (e == cudaSuccess) e = r;
  if (e == cudaSuccess) loaded.fetch_or(bit, std::memory_order_acq_rel);
  return e;
}

}  // namespace

cudaError_t waitCounter(const volatile uint64_t* counter, uint64_t target, uint64_t timeoutNs,
                        volatile int* timedOut, cudaStream_t stream) {
  if (counter == nullptr) return cudaErrorInvalidValue;
  cudaError_t e = preloadAllOnce();
  if (e != cudaSuccess) return e;
  waitCounterKernel<<<1, 1, 0, stream>>>(counter, target, timeoutNs, timedOut);
  return cudaGetLastError();
}

cudaError_t signalCounter(volatile uint64_t* counter, uint64_t value, cudaStream_t stream) {
  if (counter == nullptr) return cudaErrorInvalidValue;
  signalCounterKernel<<<1, 1, 0, stream>>>(counter, value);
  return cudaGetLastError();
}

}  // namespace smdccl::cuda
