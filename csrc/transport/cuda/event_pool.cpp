#include "transport/cuda/event_pool.h"

#include <map>
#include <mutex>
#include <vector>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {
struct Pools {
  std::mutex mu;
  std::map<int, std::vector<cudaEvent_t>> free;
};
Pools& pools() {
  static auto* p = new Pools;  // never destroyed: ops may give events back at exit
  return *p;
}
}  // namespace

cudaEvent_t EventPool::take(int device) {
  {
    Pools& p = pools();
    std::lock_guard<std::mutex> lock(p.mu);
    std::vector<cudaEvent_t>& free = p.free[device];
    if (!free.empty()) {
      cudaEvent_t e = free.back();
      free.pop_back();
      return e;
    }
  }
  int current = -1;
  SMDCCL_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) SMDCCL_CUDA_CHECK(cudaSetDevice(device));
  cudaEvent_t e = nullptr;
  cudaError_t made = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (current != device) (void)cudaSetDevice(current);
  if (made != cudaSuccess) throwCudaError(made, "cudaEventCreateWithFlags");
  return e;
}

void EventPool::give(int device, cudaEvent_t e) noexcept {
  if (!e) return;
  Pools& p = pools();
  std::lock_guard<std::mutex> lock(p.mu);
  p.free[device].push_back(e);
}

}  // namespace smdccl
