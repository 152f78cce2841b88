#pragma once
// Blocks of a group-wide buffer (one block per group rank, in rank order)
// laid out node by node instead: node 0's ranks in local order, then node
// 1's, ... The two-level reduce-scatter and allgather on CUDA tensors need
// each node's blocks side by side (one intra-node collective per node's
// region); with ranks numbered node by node (torchrun's order) the layouts
// are the same and nothing moves.
#include <cstddef>
#include <vector>

#include "topology/topology.h"

namespace smdccl {

// `count` consecutive blocks at rank-order index `from` go to node-major
// index `to`.
struct BlockRun {
  size_t from = 0, to = 0, count = 0;
  bool operator==(const BlockRun& o) const {
    return from == o.from && to == o.to && count == o.count;
  }
};

// The moves from rank order to node-major order, as few runs as the
// ranks' numbering allows (one identity run where they are the same).
std::vector<BlockRun> nodeMajorRuns(const Hierarchy& h);
// The same moves from node-major order back to rank order.
std::vector<BlockRun> reversed(std::vector<BlockRun> runs);
// Whether rank order is node-major order (nodeMajorRuns would move nothing).
bool rankOrderIsNodeMajor(const Hierarchy& h);

}  // namespace smdccl
