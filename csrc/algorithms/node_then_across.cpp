#include "algorithms/node_then_across.h"

#include <vector>

#include "topology/node_major.h"

namespace smdccl {

namespace {

// Each run's blocks from `src` to `dst`.
void moveRuns(NodeThenAcrossSteps& s, const std::vector<BlockRun>& runs, char* dst, const char* src,
              size_t blockBytes) {
  for (const BlockRun& run : runs)
    s.copy(dst + run.to * blockBytes, src + run.from * blockBytes, run.count * blockBytes);
}

}  // namespace

void nodeThenAcrossReduceScatter(Comm& c, NodeThenAcrossSteps& s, const BlockReduction& r) {
  const Hierarchy& h = levelsOf(c);
  const size_t nodes = static_cast<size_t>(h.numNodes()),
               local = static_cast<size_t>(h.localSize());
  const size_t blockBytes = r.each * elementSize(r.dt);
  const bool direct = rankOrderIsNodeMajor(h);
  // mine[n]: the block of node n's rank of this local index, reduced over this node.
  char* mine = s.scratch(nodes * blockBytes + (direct ? 0 : nodes * local * blockBytes));
  const char* in = r.in;
  if (!direct) {
    char* sorted = mine + nodes * blockBytes;
    moveRuns(s, nodeMajorRuns(h), sorted, r.in, blockBytes);
    in = sorted;
  }
  for (size_t n = 0; n < nodes; ++n)
    s.nodeReduceScatter({.in = in + n * local * blockBytes,
                         .out = mine + n * blockBytes,
                         .each = r.each,
                         .dt = r.dt,
                         .op = r.op});
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  s.acrossReduceScatter(across, {.in = mine, .out = r.out, .each = r.each, .dt = r.dt, .op = r.op});
}

void acrossThenNodeAllgather(Comm& c, NodeThenAcrossSteps& s, const BlockGather& b) {
  const Hierarchy& h = levelsOf(c);
  const size_t nodes = static_cast<size_t>(h.numNodes()),
               local = static_cast<size_t>(h.localSize());
  const size_t eb = b.eachBytes;
  const bool direct = rankOrderIsNodeMajor(h);
  // theirs[n]: the block of node n's rank of this local index.
  char* theirs = s.scratch(nodes * eb + (direct ? 0 : nodes * local * eb));
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  s.acrossAllgather(across, {.in = b.in, .out = theirs, .eachBytes = eb});
  char* sorted = direct ? b.out : theirs + nodes * eb;
  for (size_t n = 0; n < nodes; ++n)
    s.nodeAllgather({.in = theirs + n * eb, .out = sorted + n * local * eb, .eachBytes = eb});
  if (!direct) moveRuns(s, reversed(nodeMajorRuns(h)), b.out, sorted, eb);
}

void acrossThenNodeBroadcast(Comm& c, NodeThenAcrossSteps& s, const CollectiveArgs& a) {
  const Hierarchy& h = levelsOf(c);
  const Hierarchy::Place root = h.placeOf(a.root);
  if (h.numNodes() > 1 && h.myLocal == root.local) {
    Comm across = c.sub(h.acrossNodes(root.local));
    s.acrossBroadcast(across, {.buf = a.buf, .bytes = a.bytes, .root = root.node});
  }
  s.nodeBroadcast({.buf = a.buf, .bytes = a.bytes, .root = root.local});
}

}  // namespace smdccl
