#pragma once
// The list forms of allgather and reduce_scatter on CUDA tensors run on the
// device paths, with no pinned copy: their blocks (one per rank, of any
// lengths) go into one device buffer, each padded to the longest, so that
// the device collectives' equal blocks carry them. ProcessGroupNCCL
// flattens its list forms likewise.
#include <ATen/ATen.h>

#include <cstddef>

#include "algorithms/comm.h"

namespace smdccl {

// t's bytes as a 1-D uint8 tensor on t's storage (t contiguous).
at::Tensor byteView(const at::Tensor& t);

class PaddedBlocks {
 public:
  // b.length.size() blocks of the longest length of b, on like's device;
  // zero-filled where lengths differ (padding may be reduced: it must be
  // finite).
  PaddedBlocks(const Blocks& b, const at::Tensor& like);
  size_t each() const { return each_; }
  // All blocks, as `dt` elements.
  at::Tensor all(at::ScalarType dt) const { return flat_.view(dt); }
  char* data() const { return static_cast<char*>(flat_.data_ptr()); }
  // Block r's first `bytes` bytes.
  at::Tensor block(int r, size_t bytes) const;

 private:
  size_t each_ = 0;
  at::Tensor flat_;
};

}  // namespace smdccl
