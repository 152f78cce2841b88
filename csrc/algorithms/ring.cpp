// Ring reduce-scatter and allgather (bandwidth-optimal: each rank sends and
// receives (p-1)/p of the data per phase). The ring follows the node-major
// order, so it crosses each node boundary once per direction.
//
// All steps of a ring run as one streaming exchange: the send of step s+1
// forwards the block that step s is still receiving (limitBy), chunk by chunk
// while it is in cache, instead of waiting for the whole step and reading
// the block back from memory. Sends to the next rank, and receives from the
// previous one, stay in step order (the exchange keeps each link's order).
#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

// Position i of the ring finishes the reduce-scatter owning logical block
// (i+1) mod p; logical block k is mapped to the data block of the rank at ring
// position k-1, so every rank ends up owning its own data block.
int ringDataBlock(const Comm& c, int logical) {
  int p = c.size();
  return c.ring[((logical - 1) % p + p) % p];
}

int appendRing(Exchange& ex, Comm& c, const RsAgPhases& a) {
  char* buf = a.buf;
  const Blocks& b = *a.blocks;
  const DType dt = a.dt;
  const RedOp op = a.op;
  const int startAfter = a.startAfter;
  int p = c.size();
  if (p == 1) return -1;
  int i = c.ringPosition();
  int nextRank = c.ring[(i + 1) % p], prevRank = c.ring[(i - 1 + p) % p];
  Link& next = c.link(nextRank);
  Link& prev = c.link(prevRank);
  bool f32 = dt == DType::F32;
  Wire sendWire = f32 ? c.wireTo(nextRank) : Wire::F32;
  Wire recvWire = f32 ? c.wireTo(prevRank) : Wire::F32;
  Wire roundLast = a.finalReduce ? c.resultWire(dt) : Wire::F32;
  int steps = 0;
  // Messages on one link keep their order by themselves (Exchange), so the
  // only dependencies here are the start and the forwarding.
  int lastRecv = -1;
  bool first = true;
  // Out of place, the input's blocks are sent and reduced from `in` until
  // a step has written them to buf; the last sum goes to `mine`.
  const char* in = a.in ? a.in : buf;
  auto step = [&](int sendBlk, int recvBlk, bool reduce, bool forward) {
    Exchange::Deps sendDeps{first ? startAfter : -1, forward ? lastRecv : -1};
    // A receive that reduces must wait for the data it reduces into.
    Exchange::Deps recvDeps{first && reduce ? startAfter : -1, -1};
    const char* sendFrom = (forward ? buf : in) + b.offset[sendBlk];
    first = false;
    ++steps;
    ex.send(next, sendFrom, b.length[sendBlk], sendDeps, sendWire);
    lastRecv = ex.size();
    bool lastReduce = reduce && steps == p - 1;
    const bool toMine = lastReduce && a.mine;
    char* into = toMine ? a.mine : buf + b.offset[recvBlk];
    if (reduce)
      ex.recvReduce(prev, into, b.length[recvBlk],
                    {.dtype = dt,
                     .op = op,
                     .wire = recvWire,
                     .roundTo = lastReduce ? roundLast : Wire::F32,
                     .from = in + b.offset[recvBlk],
                     // A result too large for the caches to keep is written around them.
                     .streamOut = toMine && b.length[recvBlk] >= streamingOutBytes()},
                    recvDeps);
    else ex.recv(prev, buf + b.offset[recvBlk], b.length[recvBlk], recvDeps, recvWire);
  };
  if (a.reduceScatter) {
    // Step s sends logical block i-s (for s > 0: the one step s-1 reduced)
    // and reduces block i-s-1 into our copy.
    for (int s = 0; s < p - 1; ++s)
      step(ringDataBlock(c, i - s), ringDataBlock(c, i - s - 1), /*reduce=*/true,
           /*forward=*/s > 0);
  }
  if (a.allgather) {
    // Step s sends block i+1-s (our own first, then what step s-1 received).
    for (int s = 0; s < p - 1; ++s)
      step(ringDataBlock(c, i + 1 - s), ringDataBlock(c, i - s), /*reduce=*/false,
           /*forward=*/s > 0 || a.reduceScatter);
  }
  return lastRecv;
}

namespace {

void runRing(Comm& c, const RsAgPhases& a) {
  Exchange ex = c.exchange();
  appendRing(ex, c, a);
  ex.run();
}

}  // namespace

void ringReduceScatter(Comm& c, const CollectiveArgs& a) {
  runRing(c, {.buf = a.buf,
              .blocks = a.blocks,
              .in = a.in,
              .mine = a.out,
              .dt = a.dt,
              .op = a.op,
              .allgather = false});
}

void ringAllgather(Comm& c, char* buf, const Blocks& b) {
  runRing(c, {.buf = buf, .blocks = &b, .reduceScatter = false});
}

void ringAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  Blocks b = Blocks::even(count, c.size(), elementSize(dt));
  runRing(c, {.buf = buf, .blocks = &b, .dt = dt, .op = op});
}

void ringReduce(Comm& c, const CollectiveArgs& a) { reduceScatterThenGather(c, a, appendRing); }

namespace {

class Ring final : public Algorithm {
 public:
  const char* name() const override { return "ring"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::ReduceScatter ||
           coll == Collective::Allgather || coll == Collective::Reduce;
  }
  // Under a 16-bit wire on every hop the chain's roundings grow with p
  // (halving.cpp): the model picks a pairwise schedule; SMDCCL_ALGO=ring
  // still gets the ring.
  bool autoCandidate(Collective coll, const Situation& s) const override {
    return coll == Collective::Allgather || !(s.everyHop16 && s.g.ranks > 2);
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    int p = s.g.ranks;
    switch (coll) {
      case Collective::Allreduce: return k.ring(2 * (p - 1), bytes / p, p - 1);
      case Collective::ReduceScatter: return k.ring(p - 1, bytes / p, p - 1);
      case Collective::Allgather: return k.ring(p - 1, bytes / p, 0);
      default:  // reduce: a reduce-scatter, then every rank's block to the root
        return k.ring(p - 1, bytes / p, p - 1) + gatherSeconds(bytes, k);
    }
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    switch (coll) {
      case Collective::Allreduce: ringAllreduce(comm, a.buf, a.count, a.dt, a.op); break;
      case Collective::ReduceScatter: ringReduceScatter(comm, a); break;
      case Collective::Allgather: ringAllgather(comm, a.buf, *a.blocks); break;
      default: ringReduce(comm, a); break;
    }
  }
  const char* kin(Collective coll) const override {
    return coll == Collective::Broadcast ? "chain" : nullptr;
  }
  bool outOfPlace(Collective coll) const override { return coll == Collective::ReduceScatter; }
};

}  // namespace

const Algorithm& ringAlgorithm() {
  static const Ring a;
  return a;
}

}  // namespace smdccl
