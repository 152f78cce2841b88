// Two-level recursive doubling (two_level_rd): recursive doubling inside
// each node over shared memory, then across nodes. Latency-optimal for small
// messages on several nodes: log2(L) cheap rounds, then log2(n) crossings.
#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "algorithms/tuning.h"

namespace smdccl {

void twoLevelRdAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  const Hierarchy& h = levelsOf(c);
  Comm local = c.sub(h.nodes[h.myNode]);
  recursiveDoublingAllreduce(local, buf, count, dt, op);
  if (h.numNodes() == 1) return;
  if (h.uniform()) {
    // Every local rank holds the node's sum: all of them cross at once,
    // each with its peers of the same local index, and all end identical.
    Comm across = c.sub(h.acrossNodes(h.myLocal));
    recursiveDoublingAllreduce(across, buf, count, dt, op);
    return;
  }
  // Uneven nodes: the first rank of each node crosses, then tells its node.
  if (h.myLocal == 0) {
    Comm leaders = c.sub(h.acrossNodes(0));
    recursiveDoublingAllreduce(leaders, buf, count, dt, op);
  }
  treeBroadcast(local, buf, count * elementSize(dt), 0);
}

namespace {

class TwoLevelRd final : public Algorithm {
 public:
  const char* name() const override { return "two_level_rd"; }
  bool serves(Collective coll) const override { return coll == Collective::Allreduce; }
  bool canRun(Collective coll, const Situation& s) const override {
    return !s.subgroup && s.g.nodes > 1 && s.g.maxLocal > 1;
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const GroupShape& g = s.g;
    Costs k{m, g};
    int n = g.nodes, R = floorLog2(n);
    double across = g.uniform ? g.maxLocal : 1;  // messages through one uplink at once
    double inter = R * (m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds(bytes * across) +
                        k.reduceSeconds(bytes));
    if ((1 << R) != n) inter += 2 * (m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds(bytes * across));
    double t = k.rdLocal(bytes, g.maxLocal) + inter;
    if (!g.uniform) t += ceilLog2(g.maxLocal) * m.intra.secondsFor(bytes);  // leaders broadcast
    return t;
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    twoLevelRdAllreduce(comm, a.buf, a.count, a.dt, a.op);
  }
  const char* fallback() const override { return "rd"; }
  const char* kin(Collective coll) const override {
    switch (coll) {
      case Collective::ReduceScatter:
      case Collective::Allgather: return "two_level";
      case Collective::Broadcast: return "two_level_tree";
      case Collective::Reduce: return "tree";
      default: return nullptr;
    }
  }
};

}  // namespace

const Algorithm& twoLevelRdAlgorithm() {
  static const TwoLevelRd a;
  return a;
}

}  // namespace smdccl
