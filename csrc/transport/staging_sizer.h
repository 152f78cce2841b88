#pragma once
// How big a reusable staging buffer should be: it grows to the largest
// request at once (by half at least, so a series of growing messages does
// not reallocate each time), and after a burst it shrinks back once a
// window of requests has used at most a quarter of it. Pure arithmetic, no
// memory: the pinned buffer of the GPU paths (transport/cuda/pinned_buffer.h)
// follows it, and the C++ tests check it without a GPU.
#include <cstddef>

namespace smdccl {

class StagingSizer {
 public:
  static constexpr size_t kGranule = size_t(1) << 20;  // sizes are whole MiB

  // `window`: requests in a row, all needing at most a quarter of the
  // capacity, after which it shrinks to their largest (0: never shrinks).
  explicit StagingSizer(int window) : window_(window) {}

  // The capacity to have for `request` bytes, given `capacity` now: the same
  // when it fits and no shrink is due, larger when it does not fit, smaller
  // after a window of small requests. Never below `request`.
  size_t fit(size_t capacity, size_t request);

 private:
  static size_t roundUp(size_t bytes) { return (bytes + kGranule - 1) / kGranule * kGranule; }
  int window_;
  int seen_ = 0;     // requests in the current window
  size_t peak_ = 0;  // the largest of them
};

}  // namespace smdccl
