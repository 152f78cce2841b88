// Recursive-halving reduce-scatter and recursive-doubling allgather
// (Rabenseifner) for groups of a power-of-two size. Same bytes per rank as
// the ring ((p-1)/p of the data per phase), log2(p) steps instead of p-1.
//
// Why it exists: accuracy on a 16-bit wire. A ring sums each block along a
// chain, so the value crossing the last hop is the partial sum of p-1 ranks
// and every hop rounds a larger partial sum: p roundings of magnitudes
// growing like sqrt(1), sqrt(2), ... sqrt(p). Halving adds pairwise, like a
// tree: each rank's own partial sum stays float32 and only what crosses a hop
// is rounded, so the roundings are of magnitudes sqrt(1), sqrt(1), sqrt(2),
// sqrt(1), sqrt(1), sqrt(2), sqrt(4), ... (see bench/results/README.md for
// the measured max error against torch's fp16 hook).
//
// Steps are whole-range transfers ordered by `after`; callers pipeline by
// appending one schedule per chunk into the same exchange (the links keep
// each chunk's messages in order, so chunk k+1's first step overlaps chunk
// k's later ones).
#include <stdexcept>

#include "algorithms/comm.h"
#include "algorithms/cost_model.h"

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

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

bool prefersHalving(const Comm& c, DType dt) {
  int p = c.size();
  if (!c.compressesSomeHop(dt) || p <= 2 || !isPowerOfTwo(p)) return false;
  if (c.wireIntra) return true;
  // Every hop must cross nodes. Decided from the topology, which every rank
  // shares, so all ranks pick the same schedule.
  const Topology& topo = c.mesh.topology();
  for (int a = 0; a < p; ++a)
    for (int b = a + 1; b < p; ++b)
      if (topo.sameNode(c.groupRank(a), c.groupRank(b))) return false;
  return true;
}

int appendHalving(Exchange& ex, Comm& c, char* buf, const Blocks& b, DType dt, RedOp op,
                  bool reduceScatter, bool allgather, int startAfter, bool finalReduce) {
  int p = c.size();
  if (p == 1) return -1;
  if (!isPowerOfTwo(p)) throw std::logic_error("recursive halving needs a power-of-two group");
  const int r = c.rank();
  const bool f32 = dt == DType::F32;
  const Wire roundFinal = finalReduce ? c.resultWire(dt) : Wire::F32;
  int last = startAfter;  // the transfer everything next depends on

  if (reduceScatter) {
    // Step with distance m: this rank's range is the aligned 2m blocks
    // around r; it keeps the half holding block r, sends the other half to
    // r^m (whose half it is) and reduces what r^m sends into its own.
    for (int m = p / 2; m >= 1; m /= 2) {
      int lo = r & ~(2 * m - 1), mid = lo + m, hi = lo + 2 * m;
      int peer = r ^ m;
      bool keepLow = r < mid;
      Link& link = c.link(peer);
      Wire w = f32 ? c.wireTo(peer) : Wire::F32;
      Wire roundTo = m == 1 ? roundFinal : Wire::F32;
      for (const Run& s : runsOf(b, keepLow ? mid : lo, keepLow ? hi : mid))
        ex.send(link, buf + s.offset, s.length, {last, -1}, w);
      int stepLast = last;
      for (const Run& k : runsOf(b, keepLow ? lo : mid, keepLow ? mid : hi)) {
        stepLast = ex.size();
        ex.recvReduce(link, buf + k.offset, k.length, dt, op, {last, -1}, w, roundTo);
      }
      last = stepLast;
    }
  }
  if (allgather) {
    // Step with distance m: this rank holds the aligned m blocks around r
    // and swaps them with r^m for its m blocks.
    for (int m = 1; m < p; m *= 2) {
      int mine = r & ~(m - 1), theirs = mine ^ m;
      int peer = r ^ m;
      Link& link = c.link(peer);
      Wire w = f32 ? c.wireTo(peer) : Wire::F32;
      for (const Run& s : runsOf(b, mine, mine + m))
        ex.send(link, buf + s.offset, s.length, {last, -1}, w);
      int stepLast = last;
      for (const Run& k : runsOf(b, theirs, theirs + m)) {
        stepLast = ex.size();
        // `after` keeps the chain transitive: the next step's send, which
        // waits for this receive, then also waits for every earlier one
        // (they came over other links).
        ex.recv(link, buf + k.offset, k.length, {last, -1}, w);
      }
      last = stepLast;
    }
  }
  return last == startAfter ? -1 : last;
}

int appendReduceScatterAllgather(Exchange& ex, Comm& c, char* buf, const Blocks& b, DType dt,
                                 RedOp op, bool reduceScatter, bool allgather, int startAfter,
                                 bool finalReduce) {
  if (reduceScatter && prefersHalving(c, dt))
    return appendHalving(ex, c, buf, b, dt, op, reduceScatter, allgather, startAfter, finalReduce);
  return appendRing(ex, c, buf, b, dt, op, reduceScatter, allgather, startAfter, finalReduce);
}

void halvingAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op, size_t chunkBytes) {
  if (count == 0 || c.size() == 1) return;
  size_t es = elementSize(dt);
  size_t K = pipelineChunks(count * es, chunkBytes);
  Blocks chunks = Blocks::even(count, static_cast<int>(K), es);
  Exchange ex = c.exchange();
  for (size_t k = 0; k < K; ++k) {
    Blocks parts = Blocks::even(chunks.length[k] / es, c.size(), es);
    for (auto& o : parts.offset) o += chunks.offset[k];
    appendHalving(ex, c, buf, parts, dt, op, true, true, -1, true);
  }
  ex.run();
}

void halvingReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op) {
  Exchange ex = c.exchange();
  appendHalving(ex, c, buf, b, dt, op, true, false, -1, true);
  ex.run();
}

}  // namespace smdccl
