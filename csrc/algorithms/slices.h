#pragma once
// How a two-shot allreduce splits `count` elements over `parts` ranks: rank q
// reduces and owns [begin[q], end[q]). Slices cover the buffer in order,
// without gaps or overlap; boundaries fall on 16 bytes so that every slice of
// an aligned buffer takes the kernels' vector path. Trailing slices may be
// empty when count is small. Pure: unit-tested without a GPU.
#include <algorithm>
#include <cstddef>
#include <vector>

namespace smdccl {

struct Slices {
  std::vector<size_t> begin, end;  // elements
  Slices(size_t count, int parts, size_t elemSize) {
    size_t align = std::max<size_t>(1, 16 / elemSize);
    size_t per = (count + parts - 1) / parts;
    per = (per + align - 1) / align * align;
    for (int q = 0; q < parts; ++q) {
      begin.push_back(std::min(count, per * q));
      end.push_back(std::min(count, per * (q + 1)));
    }
  }
};

}  // namespace smdccl
