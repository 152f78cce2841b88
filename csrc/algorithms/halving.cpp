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
#include "algorithms/select.h"

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

}  // namespace

bool prefersHalving(const Comm& c, DType dt) { return c.size() > 2 && c.compressesEveryHop(dt); }

int appendHalving(Exchange& ex, Comm& c, const RsAgPhases& a) {
  char* buf = a.buf;
  const Blocks& b = *a.blocks;
  const DType dt = a.dt;
  const RedOp op = a.op;
  const bool reduceScatter = a.reduceScatter, allgather = a.allgather;
  const int startAfter = a.startAfter;
  const int p = c.size();
  if (p == 1) return -1;
  int P = 1;
  while (P * 2 <= p) P *= 2;
  const int rem = p - P;
  const int r = c.rank();
  const bool f32 = dt == DType::F32;
  const Wire roundFinal = a.finalReduce ? c.resultWire(dt) : Wire::F32;
  auto wireTo = [&](int peer) { return f32 ? c.wireTo(peer) : Wire::F32; };
  // Virtual rank v < P stands for real rank realOf(v) and owns the real
  // blocks [firstBlock(v), firstBlock(v+1)): both blocks of a folded pair.
  auto realOf = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  auto firstBlock = [&](int v) { return v < rem ? 2 * v : v + rem; };
  const bool foldedAway = r < 2 * rem && r % 2 == 0;
  // What a folded rank q gets back: every result (allreduce), its own block
  // (reduce-scatter), or every block but its own (allgather).
  auto foldBack = [&](int q) {
    if (!allgather) return runsOf(b, q, q + 1);
    if (reduceScatter) return runsOf(b, 0, p);
    std::vector<Run> runs = runsOf(b, 0, q);
    for (const Run& s : runsOf(b, q + 1, p)) runs.push_back(s);
    return runs;
  };
  const int v = r < 2 * rem ? r / 2 : r - rem;
  int last = startAfter;  // the transfer everything next depends on

  if (foldedAway) {
    // Hand everything (or, gathering only, this rank's block) to r+1 and
    // wait for the results.
    Link& link = c.link(r + 1);
    Wire w = wireTo(r + 1);
    int sent = last;
    for (const Run& s : reduceScatter ? runsOf(b, 0, p) : runsOf(b, r, r + 1)) {
      sent = ex.size();
      ex.send(link, buf + s.offset, s.length, {last, -1}, w);
    }
    std::vector<Run> back = foldBack(r);
    for (const Run& k : back) {
      last = ex.size();
      ex.recv(link, buf + k.offset, k.length, {sent, -1}, w);
    }
    return last == startAfter ? -1 : last;
  }
  if (r < 2 * rem) {
    Link& link = c.link(r - 1);
    Wire w = wireTo(r - 1);
    int stepLast = last;
    for (const Run& k : reduceScatter ? runsOf(b, 0, p) : runsOf(b, r - 1, r)) {
      stepLast = ex.size();
      if (reduceScatter) ex.recvReduce(link, buf + k.offset, k.length, {dt, op, w}, {last, -1});
      else ex.recv(link, buf + k.offset, k.length, {last, -1}, w);
    }
    last = stepLast;
  }

  if (reduceScatter) {
    // Step with distance m: this rank's range is the aligned 2m virtual
    // blocks around v; it keeps the half holding v, sends the other half to
    // v^m (whose half it is) and reduces what v^m sends into its own.
    for (int m = P / 2; m >= 1; m /= 2) {
      int lo = v & ~(2 * m - 1), mid = lo + m, hi = lo + 2 * m;
      int peer = realOf(v ^ m);
      bool keepLow = v < mid;
      Link& link = c.link(peer);
      Wire w = wireTo(peer);
      Wire roundTo = m == 1 ? roundFinal : Wire::F32;
      int sendLo = firstBlock(keepLow ? mid : lo), sendHi = firstBlock(keepLow ? hi : mid);
      int keepLo = firstBlock(keepLow ? lo : mid), keepHi = firstBlock(keepLow ? mid : hi);
      for (const Run& s : runsOf(b, sendLo, sendHi))
        ex.send(link, buf + s.offset, s.length, {last, -1}, w);
      int stepLast = last;
      for (const Run& k : runsOf(b, keepLo, keepHi)) {
        stepLast = ex.size();
        ex.recvReduce(link, buf + k.offset, k.length, {dt, op, w, roundTo}, {last, -1});
      }
      last = stepLast;
    }
  }
  if (allgather) {
    // Step with distance m: this rank holds the aligned m virtual blocks
    // around v and swaps them with v^m for its m blocks.
    for (int m = 1; m < P; m *= 2) {
      int mine = v & ~(m - 1), theirs = mine ^ m;
      int peer = realOf(v ^ m);
      Link& link = c.link(peer);
      Wire w = wireTo(peer);
      for (const Run& s : runsOf(b, firstBlock(mine), firstBlock(mine + m)))
        ex.send(link, buf + s.offset, s.length, {last, -1}, w);
      int stepLast = last;
      for (const Run& k : runsOf(b, firstBlock(theirs), firstBlock(theirs + m))) {
        stepLast = ex.size();
        // `after` keeps the chain transitive: the next step's send, which
        // waits for this receive, then also waits for every earlier one
        // (they came over other links).
        ex.recv(link, buf + k.offset, k.length, {last, -1}, w);
      }
      last = stepLast;
    }
  }
  if (r < 2 * rem) {
    // Hand the folded partner its results.
    Link& link = c.link(r - 1);
    std::vector<Run> back = foldBack(r - 1);
    for (const Run& s : back) ex.send(link, buf + s.offset, s.length, {last, -1}, wireTo(r - 1));
  }
  return last == startAfter ? -1 : last;
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
  bool serves(Collective c) const override {
    return c == Collective::Allreduce || c == Collective::ReduceScatter || c == Collective::Reduce;
  }
  double estimate(Collective c, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    int p = s.g.ranks;
    double rs = halvingPhase(bytes, k, true);
    switch (c) {
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
  void run(Collective c, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    switch (c) {
      case Collective::Allreduce: halvingAllreduce(comm, a, t.pipelineChunkBytes); break;
      case Collective::ReduceScatter:
        halvingReduceScatter(comm, a.buf, *a.blocks, a.dt, a.op);
        break;
      default: reduceScatterThenGather(comm, a, appendHalving); break;
    }
  }
  const char* kin(Collective c) const override {
    return c == Collective::Broadcast ? "tree" : c == Collective::Allgather ? "ring" : nullptr;
  }
};

}  // namespace

const Algorithm& halvingAlgorithm() {
  static const Halving a;
  return a;
}

}  // namespace smdccl
