// Two-level trees (two_level_tree). Allreduce: the two-level pipeline of
// two_level.cpp (intra-node reduce-scatter over shared memory, each local
// rank's shard across the nodes, intra-node allgather), with each shard
// allreduced over a double binary tree of the nodes (tree.cpp) instead of a
// ring: log2(n) latency across many nodes. Broadcast: a binomial tree
// across nodes, then inside each node.
#include <algorithm>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "algorithms/tuning.h"

namespace smdccl {

void twoLevelBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  const Hierarchy& h = levelsOf(c);
  // The root speaks for its node; elsewhere the first rank does.
  int rootNode = -1;
  for (int j = 0; j < h.numNodes(); ++j)
    if (std::find(h.nodes[j].begin(), h.nodes[j].end(), c.groupRank(root)) != h.nodes[j].end())
      rootNode = j;
  std::vector<int> leaders = h.acrossNodes(0);
  leaders[rootNode] = c.groupRank(root);
  const auto& mine = h.nodes[h.myNode];
  int myLeader = leaders[h.myNode];
  if (c.groupRank(c.rank()) == myLeader) {
    Comm across = c.sub(leaders);
    treeBroadcast(across, buf, bytes, rootNode);
  }
  Comm local = c.sub(mine);
  int leaderLocal = static_cast<int>(std::find(mine.begin(), mine.end(), myLeader) - mine.begin());
  treeBroadcast(local, buf, bytes, leaderLocal);
}

namespace {

class TwoLevelTree final : public Algorithm {
 public:
  const char* name() const override { return "two_level_tree"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::Broadcast;
  }
  bool canRun(Collective coll, const Situation& s) const override {
    return !s.subgroup && s.g.nodes > 1 && s.g.maxLocal > 1;
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const GroupShape& g = s.g;
    int L = g.maxLocal, n = g.nodes;
    if (coll == Collective::Broadcast)
      return ceilLog2(n) * m.inter.secondsFor(bytes) + ceilLog2(L) * m.intra.secondsFor(bytes);
    Costs k{m, g};
    double K =
        static_cast<double>(pipelineChunks(static_cast<size_t>(bytes), s.pipelineChunkBytes));
    double A =
        m.intra.bytesSeconds(2.0 * (L - 1) / L * bytes) + k.reduceSeconds((L - 1.0) / L * bytes);
    // L shard trees share the uplink: together they move what one tree of
    // the whole chunk would.
    double E = doubleTreeSeconds(bytes / K, n, m.inter, m.reduceGbps) * K;
    double latency = 2 * (L - 1) * m.intra.alphaUs * 1e-6;
    return latency + std::max(A, E) + std::min(A, E) / K +
           (K - 1) * 2 * (L - 1) * kPerMessageUs * 1e-6;
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    if (coll == Collective::Broadcast) {
      twoLevelBroadcast(comm, a.buf, a.bytes, a.root);
      return;
    }
    twoLevelAllreduce(comm, a,
                      {.chunkBytes = t.pipelineChunkBytes,
                       .across = AcrossNodes::DoubleTree,
                       .interLink = &t.model.inter});
  }
  const char* fallback() const override { return "tree"; }
  const char* kin(Collective coll) const override {
    return coll == Collective::ReduceScatter || coll == Collective::Allgather ? "two_level"
                                                                              : nullptr;
  }
};

}  // namespace

const Algorithm& twoLevelTreeAlgorithm() {
  static const TwoLevelTree a;
  return a;
}

}  // namespace smdccl
