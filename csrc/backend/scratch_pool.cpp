#include "backend/scratch_pool.h"
#include <cstdint>

namespace smdccl {

at::Tensor ScratchPool::take(int64_t numel, at::ScalarType dtype) {
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  at::Tensor buffer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bool free = kept_.defined() && kept_.storage().use_count() == 1;
    if (free && kept_.numel() >= bytes) {
      smallTakes_ = bytes * 4 < kept_.numel() ? smallTakes_ + 1 : 0;
      if (smallTakes_ < kShrinkAfter) {
        buffer = kept_.narrow(0, 0, bytes);
      } else {
        kept_ = at::Tensor();  // shrink: the next line keeps this size instead
        smallTakes_ = 0;
      }
    }
    if (!buffer.defined()) {
      at::Tensor fresh = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
      // Keep the larger of the two buffers unless the kept one is busy (an op
      // nested in another op's completion): then this one is used once.
      if (!kept_.defined() || (free && kept_.numel() < bytes)) kept_ = fresh;
      buffer = fresh;
    }
  }
  return bytes ? buffer.view(dtype) : at::empty({0}, at::TensorOptions().dtype(dtype));
}

at::Tensor ScratchPool::copyOf(const at::Tensor& like) {
  at::Tensor out = take(like.numel(), like.scalar_type());
  if (like.numel()) out.copy_(like.reshape({-1}));
  return out;
}

}  // namespace smdccl
