#pragma once
#include <cuda_runtime_api.h>

#include "transport/cuda/cuda_check.h"
#include "transport/cuda/event_pool.h"

namespace smdccl {

// Internal streams are never destroyed: a tensor of a collective is
// recordStream()ed on one, and when such a tensor is freed - maybe after its
// group was destroyed (DDP's gradients at exit) - the caching allocator
// records an event on that stream, which on a destroyed stream aborts the
// process. A destroyed group's stream (idle by then) goes back here and the
// next group on that device takes it, as torch's own pool streams are reused.
class InternalStreams {
 public:
  // A stream of the group's own, at the device's highest priority. Not one
  // of torch's pool streams: torch.cuda.Stream() hands those out too, and
  // the host waits on this stream would then also wait for the user's work.
  static cudaStream_t take(int dev) {
    if (cudaStream_t s = HandlePool<cudaStream_t>::take(dev)) return s;
    DeviceScope scope(dev);
    int least = 0, greatest = 0;
    SMDCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    SMDCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return s;
  }
  static void giveBack(int dev, cudaStream_t s) { HandlePool<cudaStream_t>::give(dev, s); }
};

}  // namespace smdccl
