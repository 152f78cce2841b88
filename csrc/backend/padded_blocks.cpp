#include "backend/padded_blocks.h"

#include <algorithm>

namespace smdccl {

at::Tensor byteView(const at::Tensor& t) {
  if (t.nbytes() == 0) return at::empty({0}, t.options().dtype(at::kByte));
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())},
                       t.options().dtype(at::kByte));
}

PaddedBlocks::PaddedBlocks(const Blocks& b, const at::Tensor& like) {
  const auto [shortest, longest] = std::minmax_element(b.length.begin(), b.length.end());
  each_ = *longest;  // one block per rank: never empty
  const int64_t bytes = static_cast<int64_t>(each_ * b.length.size());
  const at::TensorOptions bytesOn = like.options().dtype(at::kByte);
  flat_ = *shortest == *longest ? at::empty({bytes}, bytesOn) : at::zeros({bytes}, bytesOn);
}

at::Tensor PaddedBlocks::block(int r, size_t bytes) const {
  return flat_.narrow(0, static_cast<int64_t>(static_cast<size_t>(r) * each_),
                      static_cast<int64_t>(bytes));
}

}  // namespace smdccl
