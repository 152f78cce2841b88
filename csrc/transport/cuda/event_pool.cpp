#include "transport/cuda/event_pool.h"

#include "transport/cuda/cuda_check.h"

namespace smdccl {

cudaEvent_t EventPool::take(int device) {
  if (cudaEvent_t e = HandlePool<cudaEvent_t>::take(device)) return e;
  DeviceScope scope(device);
  cudaEvent_t e = nullptr;
  SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

}  // namespace smdccl
