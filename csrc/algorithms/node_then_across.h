#pragma once
// Two-level reduce-scatter, allgather and broadcast with the two engines as
// parameters, in Horovod's order: the reduce-scatter inside the node first,
// so that each rank carries only its node's share of the blocks across
// nodes; the allgather across nodes first, for the same reason; the
// broadcast across nodes among the root's local index, then inside each
// node. The CUDA paths run them with NCCL inside the node and the staged
// host steps across nodes (algorithms/cuda/gpu_nccl.cpp); the in-process
// tests run the same schedule with the host algorithms as both engines.
// Needs nodes of equal size (Hierarchy::uniform) and the whole group.
#include <cstddef>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"

namespace smdccl {

// Each step runs (or queues, in order behind the steps before it) one
// collective over this rank's node or over `across`: the ranks of this
// rank's local index on every node, by node.
class NodeThenAcrossSteps {
 public:
  virtual ~NodeThenAcrossSteps() = default;
  // Memory the engines reach, for the collective's intermediate blocks;
  // valid until the collective's last step is done.
  virtual char* scratch(size_t bytes) = 0;
  virtual void copy(char* dst, const char* src, size_t bytes) = 0;
  // Over the node, blocks by local index (r.in: localSize blocks of r.each).
  virtual void nodeReduceScatter(const BlockReduction& r) = 0;
  virtual void nodeAllgather(const BlockGather& b) = 0;
  // a.buf, a.bytes from the node's local rank a.root.
  virtual void nodeBroadcast(const CollectiveArgs& a) = 0;
  // Over `across`, blocks by node.
  virtual void acrossReduceScatter(Comm& across, const BlockReduction& r) = 0;
  virtual void acrossAllgather(Comm& across, const BlockGather& b) = 0;
  // a.root: across's rank (the root's node).
  virtual void acrossBroadcast(Comm& across, const CollectiveArgs& a) = 0;
};

// r.in: c.size() blocks of r.each elements in rank order (left as it was);
// r.out receives this rank's block reduced over the group.
void nodeThenAcrossReduceScatter(Comm& c, NodeThenAcrossSteps& s, const BlockReduction& r);
// b.in (b.eachBytes, may be b.out's own block) to block c.rank() of b.out
// on every rank.
void acrossThenNodeAllgather(Comm& c, NodeThenAcrossSteps& s, const BlockGather& b);
// In place: a.bytes at a.buf from group rank a.root to every rank.
void acrossThenNodeBroadcast(Comm& c, NodeThenAcrossSteps& s, const CollectiveArgs& a);

}  // namespace smdccl
