// Recursive-halving reduce-scatter and recursive-doubling allgather
// (Rabenseifner), any dtype and op, any group size. Same bytes per rank as
// the ring ((p-1)/p of the data per phase), 2*log2(p) steps instead of
// 2(p-1): the mid-size allreduce across many nodes, where a ring's steps
// are latency. A group that is not a power of two folds its first 2*rem
// ranks pairwise (rem = p - 2^k): the even rank of each pair hands its data
// to the odd one, which stands for both, and gets the result back at the
// end (two more whole-message hops, between neighbours).
//
// Also the accurate schedule on a 16-bit wire. A ring sums each block along
// a chain, so the value crossing the last hop is the partial sum of p-1
// ranks and every hop rounds a larger partial sum: p roundings of
// magnitudes growing like sqrt(1), sqrt(2), ... sqrt(p). Halving adds
// pairwise, like a tree: each rank's own partial sum stays float32 and only
// what crosses a hop is rounded, so the roundings are of magnitudes sqrt(1),
// sqrt(1), sqrt(2), sqrt(1), sqrt(1), sqrt(2), sqrt(4), ... (see
// bench/results/README.md for the measured max error against torch's fp16
// hook).
//
// Steps are whole-range transfers ordered by `after`; callers pipeline by
// appending one schedule per chunk into the same exchange (the links keep
// each chunk's messages in order, so chunk k+1's first step overlaps chunk
// k's later ones).
#include <stdexcept>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "algorithms/tuning.h"

namespace smdccl {

namespace {

// Runs of byte-contiguous blocks among blocks [lo, hi), without empty ones.
struct Run {
  size_t offset, length;
};
std::vector<Run> runsOf(const Blocks& b, int lo, int hi) {
  std::vector<Run> runs;
  for (int k = lo; k < hi; ++k) {
    if (b.length[k] == 0) continue;
    if (!runs.empty() && runs.back().offset + runs.back().length == b.offset[k])
      runs.back().length += b.length[k];
    else runs.push_back({b.offset[k], b.length[k]});
  }
  return runs;
}

// One rank's halving schedule appended to an exchange. Virtual rank v < P
// (P: the largest power of two <= p) stands for real rank realOf(v) and
// owns the real blocks [firstBlock(v), firstBlock(v+1)): both blocks of a
// folded pair.
class HalvingSchedule {
 public:
  HalvingSchedule(Exchange& ex, Comm& c, const RsAgPhases& a)
      : ex_(ex), c_(c), a_(a), b_(*a.blocks), p_(c.size()), r_(c.rank()), last_(a.startAfter) {
    while (P_ * 2 <= p_) P_ *= 2;
    rem_ = p_ - P_;
    v_ = r_ < 2 * rem_ ? r_ / 2 : r_ - rem_;
  }

  // The index of the last transfer appended (-1: none).
  int append() {
    if (r_ < 2 * rem_ && r_ % 2 == 0) return foldAway();
    if (r_ < 2 * rem_) takeFolded();
    if (a_.reduceScatter) halve();
    if (a_.allgather) gather();
    if (r_ < 2 * rem_) handBack();
    return last_ == a_.startAfter ? -1 : last_;
  }

 private:
  Wire wireTo(int peer) const { return a_.dt == DType::F32 ? c_.wireTo(peer) : Wire::F32; }
  int realOf(int v) const { return v < rem_ ? 2 * v + 1 : v + rem_; }
  int firstBlock(int v) const { return v < rem_ ? 2 * v : v + rem_; }
  char* at(const Run& s) const { return a_.buf + s.offset; }

  // What a folded rank q gets back: every result (allreduce), its own block
  // (reduce-scatter), or every block but its own (allgather).
  std::vector<Run> foldBack(int q) const {
    if (!a_.allgather) return runsOf(b_, q, q + 1);
    if (a_.reduceScatter) return runsOf(b_, 0, p_);
    std::vector<Run> runs = runsOf(b_, 0, q);
    for (const Run& s : runsOf(b_, q + 1, p_)) runs.push_back(s);
    return runs;
  }

  // An even rank of a folded pair hands everything (or, gathering only, its
  // block) to r+1 and waits for the results.
  int foldAway() {
    Link& link = c_.link(r_ + 1);
    Wire w = wireTo(r_ + 1);
    int sent = last_;
    for (const Run& s : a_.reduceScatter ? runsOf(b_, 0, p_) : runsOf(b_, r_, r_ + 1)) {
      sent = ex_.size();
      ex_.send(link, at(s), s.length, {last_, -1}, w);
    }
    for (const Run& k : foldBack(r_)) {
      last_ = ex_.size();
      ex_.recv(link, at(k), k.length, {sent, -1}, w);
    }
    return last_ == a_.startAfter ? -1 : last_;
  }

  // The odd rank of a folded pair takes in what its partner handed over.
  void takeFolded() {
    Link& link = c_.link(r_ - 1);
    Wire w = wireTo(r_ - 1);
    int stepLast = last_;
    for (const Run& k : a_.reduceScatter ? runsOf(b_, 0, p_) : runsOf(b_, r_ - 1, r_)) {
      stepLast = ex_.size();
      if (a_.reduceScatter)
        ex_.recvReduce(link, at(k), k.length, {a_.dt, a_.op, w}, {last_, -1});
      else ex_.recv(link, at(k), k.length, {last_, -1}, w);
    }
    last_ = stepLast;
  }

  // Step with distance m: this rank's range is the aligned 2m virtual
  // blocks around v; it keeps the half holding v, sends the other half to
  // v^m (whose half it is) and reduces what v^m sends into its own.
  void halve() {
    const Wire roundFinal = a_.finalReduce ? c_.resultWire(a_.dt) : Wire::F32;
    for (int m = P_ / 2; m >= 1; m /= 2) {
      int lo = v_ & ~(2 * m - 1), mid = lo + m, hi = lo + 2 * m;
      int peer = realOf(v_ ^ m);
      bool keepLow = v_ < mid;
      Link& link = c_.link(peer);
      Wire w = wireTo(peer);
      Wire roundTo = m == 1 ? roundFinal : Wire::F32;
      int sendLo = firstBlock(keepLow ? mid : lo), sendHi = firstBlock(keepLow ? hi : mid);
      int keepLo = firstBlock(keepLow ? lo : mid), keepHi = firstBlock(keepLow ? mid : hi);
      for (const Run& s : runsOf(b_, sendLo, sendHi))
        ex_.send(link, at(s), s.length, {last_, -1}, w);
      int stepLast = last_;
      for (const Run& k : runsOf(b_, keepLo, keepHi)) {
        stepLast = ex_.size();
        ex_.recvReduce(link, at(k), k.length, {a_.dt, a_.op, w, roundTo}, {last_, -1});
      }
      last_ = stepLast;
    }
  }

  // Step with distance m: this rank holds the aligned m virtual blocks
  // around v and swaps them with v^m for its m blocks.
  void gather() {
    for (int m = 1; m < P_; m *= 2) {
      int mine = v_ & ~(m - 1), theirs = mine ^ m;
      int peer = realOf(v_ ^ m);
      Link& link = c_.link(peer);
      Wire w = wireTo(peer);
      for (const Run& s : runsOf(b_, firstBlock(mine), firstBlock(mine + m)))
        ex_.send(link, at(s), s.length, {last_, -1}, w);
      int stepLast = last_;
      for (const Run& k : runsOf(b_, firstBlock(theirs), firstBlock(theirs + m))) {
        stepLast = ex_.size();
        // `after` keeps the chain transitive: the next step's send, which
        // waits for this receive, then also waits for every earlier one
        // (they came over other links).
        ex_.recv(link, at(k), k.length, {last_, -1}, w);
      }
      last_ = stepLast;
    }
  }

  // Hand the folded partner its results.
  void handBack() {
    Link& link = c_.link(r_ - 1);
    for (const Run& s : foldBack(r_ - 1))
      ex_.send(link, at(s), s.length, {last_, -1}, wireTo(r_ - 1));
  }

  Exchange& ex_;
  Comm& c_;
  const RsAgPhases& a_;
  const Blocks& b_;
  const int p_, r_;
  int P_ = 1, rem_ = 0, v_ = 0;
  int last_;  // the transfer everything next depends on
};

}  // namespace

bool prefersHalving(const Comm& c, DType dt) { return c.size() > 2 && c.compressesEveryHop(dt); }

int appendHalving(Exchange& ex, Comm& c, const RsAgPhases& a) {
  if (c.size() == 1) return -1;
  return HalvingSchedule(ex, c, a).append();
}

int appendReduceScatterAllgather(Exchange& ex, Comm& c, const RsAgPhases& a) {
  if (a.reduceScatter && prefersHalving(c, a.dt)) return appendHalving(ex, c, a);
  return appendRing(ex, c, a);
}

void halvingAllreduce(Comm& c, const CollectiveArgs& a, size_t chunkBytes) {
  char* buf = a.buf;
  const size_t count = a.count;
  const DType dt = a.dt;
  const RedOp op = a.op;
  if (count == 0 || c.size() == 1) return;
  size_t es = elementSize(dt);
  size_t K = pipelineChunks(count * es, chunkBytes);
  Blocks chunks = Blocks::even(count, static_cast<int>(K), es);
  Exchange ex = c.exchange();
  for (size_t k = 0; k < K; ++k) {
    Blocks parts = Blocks::even(chunks.length[k] / es, c.size(), es);
    for (auto& o : parts.offset) o += chunks.offset[k];
    appendHalving(ex, c, {.buf = buf, .blocks = &parts, .dt = dt, .op = op});
  }
  ex.run();
}

void halvingReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op) {
  Exchange ex = c.exchange();
  appendHalving(ex, c, {.buf = buf, .blocks = &b, .dt = dt, .op = op, .allgather = false});
  ex.run();
}

}  // namespace smdccl

namespace smdccl {

namespace {

// Seconds of the halving (or doubling) phase of `bytes`: step m moves m/P
// of the message; on node-major ranks a step crosses nodes once its
// distance reaches the node size, and then all L ranks of a node cross at
// once through its uplink.
double halvingPhase(double bytes, const Costs& k, bool reduce) {
  const GroupShape& g = k.g;
  int P = 1 << floorLog2(g.ranks);
  bool localPow2 = (g.maxLocal & (g.maxLocal - 1)) == 0;
  double t = 0;
  for (int m = P / 2; m >= 1; m /= 2) {
    double step = bytes * m / P;
    bool crosses = g.nodes > 1 && (!g.uniform || !localPow2 || m >= g.maxLocal);
    t += crosses ? k.m.inter.alphaUs * 1e-6 + k.m.inter.bytesSeconds(step * std::min(g.maxLocal, P))
                 : k.m.intra.secondsFor(step);
    if (reduce) t += k.reduceSeconds(step);
  }
  return t;
}

// The fold of a group that is not a power of two: `in` bytes to the odd
// neighbour before, `out` bytes back after.
double foldSeconds(double in, double out, const Costs& k) {
  const GroupShape& g = k.g;
  if ((g.ranks & (g.ranks - 1)) == 0) return 0;
  bool inside = g.nodes == 1 || (g.uniform && g.maxLocal % 2 == 0);
  const LevelCost& l = inside ? k.m.intra : k.m.inter;
  return l.secondsFor(in) + l.secondsFor(out) + k.reduceSeconds(in);
}

class Halving final : public Algorithm {
 public:
  const char* name() const override { return "halving"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::ReduceScatter ||
           coll == Collective::Reduce;
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    int p = s.g.ranks;
    double rs = halvingPhase(bytes, k, true);
    switch (coll) {
      case Collective::Allreduce: {
        // Pipelined in chunks: each more chunk costs its steps' messages.
        double K =
            static_cast<double>(pipelineChunks(static_cast<size_t>(bytes), s.pipelineChunkBytes));
        return foldSeconds(bytes, bytes, k) + rs + halvingPhase(bytes, k, false) +
               (K - 1) * 2 * floorLog2(p) * kPerMessageUs * 1e-6;
      }
      case Collective::ReduceScatter: return foldSeconds(bytes, bytes / p, k) + rs;
      default:  // reduce: then every rank's block to the root
        return foldSeconds(bytes, bytes / p, k) + rs + gatherSeconds(bytes, k);
    }
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    switch (coll) {
      case Collective::Allreduce: halvingAllreduce(comm, a, t.pipelineChunkBytes); break;
      case Collective::ReduceScatter:
        halvingReduceScatter(comm, a.buf, *a.blocks, a.dt, a.op);
        break;
      default: reduceScatterThenGather(comm, a, appendHalving); break;
    }
  }
  const char* kin(Collective coll) const override {
    return coll == Collective::Broadcast   ? "tree"
           : coll == Collective::Allgather ? "ring"
                                           : nullptr;
  }
};

}  // namespace

const Algorithm& halvingAlgorithm() {
  static const Halving a;
  return a;
}

}  // namespace smdccl
