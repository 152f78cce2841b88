// Recursive doubling allreduce: log2(p) rounds of whole-buffer exchanges,
// latency-optimal for small messages. Non-power-of-two sizes fold the extra
// ranks into partners first and hand them the result at the end. Every
// pair computes a op b in the same order on both sides, so all ranks end
// with bitwise-identical results.
#include <memory>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

void recursiveDoublingAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  int p = c.size();
  if (p == 1 || count == 0) return;
  size_t bytes = count * elementSize(dt);
  int r = c.rank();
  int pof2 = 1;
  while (pof2 * 2 <= p) pof2 *= 2;
  int rem = p - pof2;
  std::unique_ptr<char[]> tmp(new char[bytes]);
  Exchange ex = c.exchange();
  // A 16-bit wire: every value is kept at the wire's precision (rounded
  // before the first round and after each sum), so both partners of a round
  // add the same two numbers and all ranks end with the same bits.
  Wire wire = c.resultWire(dt);  // F32 where no hop is compressed: nothing rounded
  auto wireTo = [&](int peer) { return wire == Wire::F32 ? Wire::F32 : c.wireTo(peer); };
  float* f = reinterpret_cast<float*>(buf);
  roundToWire(f, wire == Wire::F32 ? 0 : count, wire);

  // Fold: among the first 2*rem ranks, even ones give their data to the odd
  // neighbour and sit out the doubling.
  int vrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      ex.send(c.link(r + 1), buf, bytes, {}, wireTo(r + 1)).run();
      vrank = -1;
    } else {
      ex.recvReduce(c.link(r - 1), buf, bytes, {dt, op, wireTo(r - 1), wire}).run();
      vrank = r / 2;
    }
  } else {
    vrank = r - rem;
  }

  if (vrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      int vpeer = vrank ^ mask;
      int peer = vpeer < rem ? vpeer * 2 + 1 : vpeer + rem;
      Wire w = wireTo(peer);
      ex.send(c.link(peer), buf, bytes, {}, w).recv(c.link(peer), tmp.get(), bytes, {}, w).run();
      // Lower rank's data first on both sides: identical rounding everywhere.
      if (peer < r) reduceTo(buf, tmp.get(), buf, count, {dt, op});
      else reduceInto(buf, tmp.get(), count, dt, op);
      roundToWire(f, wire == Wire::F32 ? 0 : count, wire);
    }
  }

  if (r < 2 * rem) {
    if (r % 2 == 0) ex.recv(c.link(r + 1), buf, bytes, {}, wireTo(r + 1)).run();
    else ex.send(c.link(r - 1), buf, bytes, {}, wireTo(r - 1)).run();
  }
}

namespace {

class RecursiveDoubling final : public Algorithm {
 public:
  const char* name() const override { return "rd"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::ReduceScatter;
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    return Costs{m, s.g}.rd(bytes);  // reduce-scatter: an allreduce of everything
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    if (coll == Collective::Allreduce) {
      recursiveDoublingAllreduce(comm, a.buf, a.count, a.dt, a.op);
      return;
    }
    // Tiny reduce-scatter: one latency-optimal allreduce of everything beats
    // p-1 ring steps. Blocks are consecutive here (the backend packs them).
    const Blocks& b = *a.blocks;
    recursiveDoublingAllreduce(comm, a.buf + b.offset[0], b.total() / elementSize(a.dt), a.dt,
                               a.op);
  }
  const char* kin(Collective coll) const override {
    switch (coll) {
      case Collective::Allgather: return "direct";
      case Collective::Broadcast:
      case Collective::Reduce: return "tree";
      default: return nullptr;
    }
  }
};

}  // namespace

const Algorithm& rdAlgorithm() {
  static const RecursiveDoubling a;
  return a;
}

}  // namespace smdccl
