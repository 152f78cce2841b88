// The int8 wire's allreduce over many nodes for tensors too small for the
// direct exchange's message count (two_level_int8_halving; the cost model
// picks it over two_level_int8): float32 inside each node, block int8
// between nodes by recursive halving and doubling, log2(nodes) messages
// per phase instead of nodes - 1:
//  1. inside the node, a float32 reduce-scatter: local rank l holds the
//     node's sum of shard l, cut into one piece per node;
//  2. across nodes, among the ranks of local index l, log2(n) steps: with
//     the partner at distance n/2, n/4, ..., 1, send the pieces of the half
//     of the current range that the partner keeps, each quantized from
//     this rank's partial sum, and add the partner's decoded pieces of the
//     half kept; at the end each rank holds its own piece summed;
//  3. the owner quantizes its piece once and keeps the decoded values;
//     recursive doubling hands every quantized piece to every rank, which
//     decodes them (the same bits everywhere);
//  4. inside the node, a float32 allgather.
// An element crosses the network quantized at most log2(n) + 1 times: each
// step's partial sum (half a step of its block's scale each) and the sum.
// Pieces keep their blocks at every step, so the bound is per block.
// No error feedback: a hook that carries residuals runs two_level_int8,
// whose two quantizations the residuals cover.
#include <cstddef>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "kernels/cpu/quantize.h"

namespace smdccl {

namespace {

bool powerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

int log2Of(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

// This rank's shard cut into one piece per node, and where each piece's
// quantized form sits in a buffer of all of them (in node order).
class Pieces {
 public:
  Pieces(const Blocks& shards, int local, int nodes)
      : floats_(Blocks::even(shards.length[local] / sizeof(float), nodes, sizeof(float))),
        at_(static_cast<size_t>(nodes) + 1, 0) {
    for (int j = 0; j < nodes; ++j) {
      floats_.offset[j] += shards.offset[local];
      at_[j + 1] = at_[j] + int8Bytes(count(j));
    }
  }
  size_t count(int j) const { return floats_.length[j] / sizeof(float); }
  float* values(char* buf, int j) const {
    return reinterpret_cast<float*>(buf + floats_.offset[j]);
  }
  // Quantized pieces [lo, hi): their offset in a buffer of all, and bytes.
  size_t at(int j) const { return at_[j]; }
  size_t bytes(int lo, int hi) const { return at_[hi] - at_[lo]; }

 private:
  Blocks floats_;           // byte ranges of the tensor, by node
  std::vector<size_t> at_;  // quantized offsets, by node (one past the end last)
};

// Step 2: recursive halving of the pieces across nodes; `sent` and `got`
// hold quantized pieces at their Pieces::at offsets.
void halveAcross(Comm& across, char* buf, const Pieces& p, char* sent, char* got) {
  const int n = across.size(), me = across.rank();
  int lo = 0, hi = n;
  for (int d = n / 2; d >= 1; d /= 2) {
    const int partner = me ^ d, mid = lo + (hi - lo) / 2;
    const bool keepLow = (me & d) == 0;
    const int sendLo = keepLow ? mid : lo, sendHi = keepLow ? hi : mid;
    const int keepLo = keepLow ? lo : mid, keepHi = keepLow ? mid : hi;
    for (int j = sendLo; j < sendHi; ++j)
      quantizeInt8(sent + p.at(j), p.values(buf, j), p.count(j));
    Exchange ex = across.exchange();
    ex.send(across.link(partner), sent + p.at(sendLo), p.bytes(sendLo, sendHi));
    ex.recv(across.link(partner), got + p.at(keepLo), p.bytes(keepLo, keepHi));
    ex.run();
    for (int j = keepLo; j < keepHi; ++j)
      dequantizeAddInt8(p.values(buf, j), p.values(buf, j), got + p.at(j), p.count(j));
    lo = keepLo;
    hi = keepHi;
  }
}

// Step 3: this rank's piece quantized once (its decoded values kept), then
// recursive doubling of the quantized pieces; every other piece decoded.
void doubleAcross(Comm& across, char* buf, const Pieces& p, char* all) {
  const int n = across.size(), me = across.rank();
  quantizeInt8(all + p.at(me), p.values(buf, me), p.count(me));
  dequantizeInt8(p.values(buf, me), all + p.at(me), p.count(me));
  for (int d = 1; d < n; d *= 2) {
    const int partner = me ^ d, lo = me & ~(d - 1), theirs = partner & ~(d - 1);
    Exchange ex = across.exchange();
    ex.send(across.link(partner), all + p.at(lo), p.bytes(lo, lo + d));
    ex.recv(across.link(partner), all + p.at(theirs), p.bytes(theirs, theirs + d));
    ex.run();
  }
  for (int j = 0; j < n; ++j)
    if (j != me) dequantizeInt8(p.values(buf, j), all + p.at(j), p.count(j));
}

}  // namespace

void int8HalvingAllreduce(Comm& c, const CollectiveArgs& a, std::vector<char>& scratch) {
  const Hierarchy& h = levelsOf(c);
  Comm local = c.sub(h.nodes[h.myNode]);
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  const Blocks shards = Blocks::even(a.count, local.size(), sizeof(float));
  {
    Exchange ex = local.exchange();
    appendReduceScatterAllgather(
        ex, local, {.buf = a.buf, .blocks = &shards, .dt = a.dt, .op = a.op, .allgather = false});
    ex.run();
  }
  const Pieces p(shards, local.rank(), across.size());
  const size_t all = p.bytes(0, across.size());
  scratch.resize(2 * all);
  halveAcross(across, a.buf, p, scratch.data(), scratch.data() + all);
  doubleAcross(across, a.buf, p, scratch.data());
  Exchange ex = local.exchange();
  appendRing(ex, local, {.buf = a.buf, .blocks = &shards, .reduceScatter = false});
  ex.run();
}

namespace {

class TwoLevelInt8Halving final : public Algorithm {
 public:
  const char* name() const override { return "two_level_int8_halving"; }
  bool serves(Collective coll) const override { return coll == Collective::Allreduce; }
  // A group compressed to int8, float32 SUM, a power of two (> 2) of
  // uniform nodes (two nodes: the direct exchange is one message already),
  // no error feedback.
  bool canRun(Collective coll, const Situation& s) const override {
    return s.int8 && !s.subgroup && s.g.nodes > 2 && powerOfTwo(s.g.nodes) && s.g.uniform &&
           !s.int8Feedback;
  }
  // log2(n) rounds of one message per phase, each a start-up; no
  // pipeline: the node's steps and the network's follow each other.
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const Int8Parts p = int8Parts(coll, bytes, s, m);
    return p.intraAlphas + 2.0 * log2Of(s.g.nodes) * p.interAlpha + p.intra + p.inter;
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    if (a.count == 0) return;
    std::vector<char> own;  // a lone exchange's Comm (tests) has no book
    int8HalvingAllreduce(comm, a, comm.book ? comm.book->quantized : own);
  }
  const char* fallback() const override { return "two_level_int8"; }
  bool int8Wire() const override { return true; }
  bool autoCandidate(Collective coll, const Situation& s) const override { return false; }
};

}  // namespace

const Algorithm& twoLevelInt8HalvingAlgorithm() {
  static const TwoLevelInt8Halving a;
  return a;
}

}  // namespace smdccl
