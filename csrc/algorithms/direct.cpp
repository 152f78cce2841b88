// One-round algorithms: every transfer of the collective is posted at once
// and the exchange moves them concurrently (no ordering deadlocks, all links
// busy).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

void directAllgather(Comm& c, char* buf, const Blocks& b) {
  int me = c.rank();
  Exchange ex = c.exchange();
  for (int r = 0; r < c.size(); ++r) {
    if (r == me) continue;
    ex.send(c.link(r), buf + b.offset[me], b.length[me]);
    ex.recv(c.link(r), buf + b.offset[r], b.length[r]);
  }
  ex.run();
}

void directReduceScatter(Comm& c, const CollectiveArgs& a) {
  const Blocks& b = *a.blocks;
  const int me = c.rank(), p = c.size();
  const bool f32 = a.dt == DType::F32;
  const char* in = a.in ? a.in : a.buf;
  char* mine = a.out ? a.out : a.buf + b.offset[me];
  const size_t bytes = b.length[me];
  Exchange ex = c.exchange();
  for (int k = 1; k < p; ++k) {
    const int r = (me + k) % p;
    ex.send(c.link(r), in + b.offset[r], b.length[r], {}, f32 ? c.wireTo(r) : Wire::F32);
  }
  // The contributions in a fixed order (the same bits every run), each
  // piece of the running sum reduced again while it is in cache (limitBy):
  // no partial sums through memory, as a ring's forwarding has.
  for (int k = 1, before = -1; k < p; ++k) {
    const int r = (me - k + p) % p;
    const bool last = k == p - 1;
    const int index = ex.size();
    ex.recvReduce(c.link(r), mine, bytes,
                  {.dtype = a.dt,
                   .op = a.op,
                   .wire = f32 ? c.wireTo(r) : Wire::F32,
                   .roundTo = last ? c.resultWire(a.dt) : Wire::F32,
                   .from = before < 0 ? in + b.offset[me] : nullptr,
                   // Past the caches only where this add reads `in` (p = 2): a
                   // later add reads the running sum back from `mine`.
                   .streamOut = last && a.out && bytes >= streamingOutBytes()},
                  {-1, before});
    before = index;
  }
  ex.run();
}

void directAlltoall(Comm& c, const char* in, const Blocks& sendBlocks, char* out,
                    const Blocks& recvBlocks) {
  int me = c.rank();
  if (recvBlocks.length[me])
    std::memmove(out + recvBlocks.offset[me], in + sendBlocks.offset[me], recvBlocks.length[me]);
  Exchange ex = c.exchange();
  for (int r = 0; r < c.size(); ++r) {
    if (r == me) continue;
    ex.send(c.link(r), in + sendBlocks.offset[r], sendBlocks.length[r]);
    ex.recv(c.link(r), out + recvBlocks.offset[r], recvBlocks.length[r]);
  }
  ex.run();
}

void directGather(Comm& c, const RootBlocks& g) {
  Exchange ex = c.exchange();
  if (c.rank() == g.root) {
    const Blocks& b = *g.blocks;
    for (int r = 0; r < c.size(); ++r)
      if (r != g.root) ex.recv(c.link(r), g.out + b.offset[r], b.length[r]);
  } else {
    ex.send(c.link(g.root), g.in, g.bytes);
  }
  ex.run();
}

void directScatter(Comm& c, const RootBlocks& s) {
  Exchange ex = c.exchange();
  if (c.rank() == s.root) {
    const Blocks& b = *s.blocks;
    for (int r = 0; r < c.size(); ++r)
      if (r != s.root) ex.send(c.link(r), s.in + b.offset[r], b.length[r]);
  } else {
    ex.recv(c.link(s.root), s.out, s.bytes);
  }
  ex.run();
}

double gatherSeconds(double bytes, const Costs& k) {
  const GroupShape& g = k.g;
  int p = g.ranks;
  // Into the root's node: the other nodes' blocks through its uplink.
  if (g.nodes > 1)
    return k.m.inter.secondsFor(bytes * (p - g.maxLocal) / p) + k.m.intra.alphaUs * 1e-6;
  return k.m.intra.secondsFor(bytes * (p - 1) / p);
}

void appendGather(Exchange& ex, Comm& c, const CollectiveArgs& a, int startAfter) {
  char* buf = a.buf;
  const Blocks& b = *a.blocks;
  const int root = a.root;
  int me = c.rank();
  if (me != root) {
    ex.send(c.link(root), buf + b.offset[me], b.length[me], {startAfter, -1});
    return;
  }
  for (int r = 0; r < c.size(); ++r)
    if (r != root) ex.recv(c.link(r), buf + b.offset[r], b.length[r], {startAfter, -1});
}

void reduceScatterThenGather(Comm& c, const CollectiveArgs& a, AppendReduceScatter reduceScatter) {
  Blocks b = Blocks::even(a.count, c.size(), elementSize(a.dt));
  Exchange ex = c.exchange();
  // Only the root keeps a result: nothing is rounded for the others.
  reduceScatter(ex, c,
                {.buf = a.buf,
                 .blocks = &b,
                 .dt = a.dt,
                 .op = a.op,
                 .allgather = false,
                 .finalReduce = false});
  ex.run();  // the root's last reduce-scatter sends read blocks the gather overwrites
  appendGather(ex, c, {.buf = a.buf, .blocks = &b, .root = a.root}, -1);
  ex.run();
}

namespace {

// Sending to every peer at once contends for memory and links more than a
// ring's one-in, one-out; measured on the development VMs as ~1.5x.
constexpr double kDirectContention = 1.5;
constexpr int kDirectReduceScatterRanks = 4;

class Direct final : public Algorithm {
 public:
  const char* name() const override { return "direct"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allgather || coll == Collective::ReduceScatter;
  }
  // A reduce-scatter on one node's shared memory contends too, but keeps
  // its partial sums in cache where a ring writes p - 2 blocks of them
  // through memory and reads them back: measured faster than the ring at 3
  // and 4 ranks (1-64 MiB), about even at 8. Offered only there (elsewhere
  // only by SMDCCL_ALGO), where it costs what a ring does less the ring's
  // p - 2 extra steps.
  bool autoCandidate(Collective coll, const Situation& s) const override {
    return coll != Collective::ReduceScatter ||
           (s.g.nodes == 1 && !s.subgroup && s.g.ranks <= kDirectReduceScatterRanks);
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const GroupShape& g = s.g;
    int p = g.ranks;
    const Costs costs{m, g};
    const LevelCost& b = costs.bottleneck();
    // Through a node's uplink: its L ranks' blocks to every other node's ranks.
    double through = g.nodes > 1 ? g.maxLocal * (p - g.maxLocal) * bytes / p : (p - 1) * bytes / p;
    if (coll == Collective::Allgather)
      return b.alphaUs * 1e-6 + b.bytesSeconds(through) * (p > 2 ? kDirectContention : 1.0);
    return b.alphaUs * 1e-6 + b.bytesSeconds(through) + costs.reduceSeconds(through);
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    if (coll == Collective::ReduceScatter) directReduceScatter(comm, a);
    else directAllgather(comm, a.buf, *a.blocks);
  }
  bool outOfPlace(Collective coll) const override { return coll == Collective::ReduceScatter; }
};

}  // namespace

const Algorithm& directAlgorithm() {
  static const Direct a;
  return a;
}

}  // namespace smdccl
