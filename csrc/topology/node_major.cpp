#include "topology/node_major.h"

#include <utility>

namespace smdccl {

std::vector<BlockRun> nodeMajorRuns(const Hierarchy& h) {
  std::vector<BlockRun> runs;
  size_t to = 0;
  for (const std::vector<int>& node : h.nodes) {
    for (int rank : node) {
      const size_t from = static_cast<size_t>(rank);
      BlockRun* last = runs.empty() ? nullptr : &runs.back();
      if (last && last->from + last->count == from && last->to + last->count == to) ++last->count;
      else runs.push_back({from, to, 1});
      ++to;
    }
  }
  return runs;
}

std::vector<BlockRun> reversed(std::vector<BlockRun> runs) {
  for (BlockRun& run : runs) std::swap(run.from, run.to);
  return runs;
}

bool rankOrderIsNodeMajor(const Hierarchy& h) {
  const std::vector<BlockRun> runs = nodeMajorRuns(h);
  return runs.size() == 1 && runs[0].from == runs[0].to;
}

}  // namespace smdccl
