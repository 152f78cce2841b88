#include "algorithms/comm.h"

#include <algorithm>
#include <stdexcept>

namespace smdccl {

int Comm::ringPosition() const {
  auto it = std::find(ring.begin(), ring.end(), rank());
  if (it == ring.end()) throw std::logic_error("rank missing from ring order");
  return static_cast<int>(it - ring.begin());
}

Blocks Blocks::even(size_t count, int parts, size_t elemSize) {
  Blocks b;
  size_t base = count / parts, extra = count % parts, at = 0;
  for (int r = 0; r < parts; ++r) {
    size_t n = base + (static_cast<size_t>(r) < extra ? 1 : 0);
    b.offset.push_back(at * elemSize);
    b.length.push_back(n * elemSize);
    at += n;
  }
  return b;
}

Blocks Blocks::fromLengths(const std::vector<size_t>& lengths) {
  Blocks b;
  size_t at = 0;
  for (size_t n : lengths) {
    b.offset.push_back(at);
    b.length.push_back(n);
    at += n;
  }
  return b;
}

size_t Blocks::total() const {
  size_t t = 0;
  for (size_t n : length) t += n;
  return t;
}

}  // namespace smdccl
