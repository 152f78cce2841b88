#pragma once
#include <cuda_runtime_api.h>

#include <c10/cuda/CUDAGuard.h>

#include <map>
#include <mutex>
#include <vector>

#include "transport/cuda/cuda_check.h"

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
    {
      std::lock_guard<std::mutex> lock(mu());
      auto& idle = pool()[dev];
      if (!idle.empty()) {
        cudaStream_t s = idle.back();
        idle.pop_back();
        return s;
      }
    }
    c10::cuda::CUDAGuard guard(dev);
    int least = 0, greatest = 0;
    SMDCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s = nullptr;
    SMDCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    return s;
  }
  static void giveBack(int dev, cudaStream_t s) {
    std::lock_guard<std::mutex> lock(mu());
    pool()[dev].push_back(s);
  }

 private:
  // Leaked on purpose: tensors may be freed during static destruction.
  static std::mutex& mu() {
    static auto* m = new std::mutex;
    return *m;
  }
  static std::map<int, std::vector<cudaStream_t>>& pool() {
    static auto* p = new std::map<int, std::vector<cudaStream_t>>;
    return *p;
  }
};

}  // namespace smdccl
