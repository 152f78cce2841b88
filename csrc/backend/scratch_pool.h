#pragma once
// Host scratch buffers kept between ops. An op that must not write into its
// input (reduce_scatter, a non-root reduce) works on a copy; a fresh
// allocation of that copy costs a page fault per 4 KiB page on every call
// (64 MiB: 16,384 faults, ~65 ms on the 2-core VM, 4x the reduction itself).

#include <ATen/ATen.h>

#include <cstdint>
#include <mutex>

namespace smdccl {

class ScratchPool {
 public:
  // A contiguous 1-D tensor with `like`'s dtype and numel, holding a copy of
  // `like` (a CPU tensor), in the kept buffer when it is free and big enough.
  at::Tensor copyOf(const at::Tensor& like);
  // The same without the copy: contents undefined.
  at::Tensor take(int64_t numel, at::ScalarType dtype);

  // After this many takes in a row that need under a quarter of the kept
  // buffer, it is given back: a burst of large ops does not pin its memory.
  static constexpr int kShrinkAfter = 64;

 private:
  std::mutex mu_;
  at::Tensor kept_;  // bytes; in use while a view of it lives (storage use count > 1)
  int smallTakes_ = 0;
};

}  // namespace smdccl
