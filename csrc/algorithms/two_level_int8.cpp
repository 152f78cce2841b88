// The int8 wire's allreduce (two_level_int8; compression="int8"): float32
// inside each node, block int8 (kernels/cpu/quantize.h) between nodes,
// quantized once per level, not per hop (the pattern of ZeRO++'s qgZ and
// EQuARX):
//  1. inside the node, a float32 reduce-scatter: local rank l holds the
//     node's sum of shard l;
//  2. across nodes, among the ranks of local index l, shard l is cut into
//     one piece per node: each rank quantizes the pieces other nodes own,
//     once, and sends each to its owner (a direct exchange); the owner adds
//     every contribution to its own piece in float32;
//  3. the owner quantizes its reduced piece once and keeps the decoded
//     values (so its bits equal what the others receive); every rank sends
//     its piece to every other node and decodes the pieces it receives;
//  4. inside the node, a float32 allgather.
// An element crosses the network quantized twice whatever the node count:
// its error is at most half a step of each other node's block scale plus
// half a step of the sum's block scale. Ranks of one node send in parallel,
// so each uplink carries 2(n-1)/n of the tensor at about 1/4 of its bytes.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/select.h"
#include "kernels/cpu/quantize.h"

namespace smdccl {

namespace {

// The pieces of a shard of `count` float32 values, one per node.
struct Pieces {
  Blocks elems;                   // byte ranges of the shard, by node
  std::vector<size_t> quantized;  // int8Bytes of each piece
  size_t most = 0;                // the largest of them
};

Pieces piecesOf(size_t count, int nodes) {
  Pieces p{Blocks::even(count, nodes, sizeof(float)), {}, 0};
  for (size_t len : p.elems.length) {
    p.quantized.push_back(int8Bytes(len / sizeof(float)));
    p.most = std::max(p.most, p.quantized.back());
  }
  return p;
}

// Steps 2 and 3 over `across` (one rank per node) on this rank's shard.
void int8AcrossNodes(Comm& across, float* shard, size_t count, std::vector<char>& scratch) {
  const int n = across.size(), me = across.rank();
  const Pieces p = piecesOf(count, n);
  // n slots: outgoing pieces by owner (slot me: the reduced piece), then
  // n incoming ones by sender.
  scratch.resize(2 * static_cast<size_t>(n) * p.most);
  auto out = [&](int j) { return scratch.data() + static_cast<size_t>(j) * p.most; };
  auto in = [&](int j) { return scratch.data() + static_cast<size_t>(n + j) * p.most; };
  auto piece = [&](int j) { return shard + p.elems.offset[j] / sizeof(float); };
  auto elems = [&](int j) { return p.elems.length[j] / sizeof(float); };

  Exchange ex = across.exchange();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    quantizeInt8(out(j), piece(j), elems(j));
    ex.send(across.link(j), out(j), p.quantized[j]);
    ex.recv(across.link(j), in(j), p.quantized[me]);
  }
  ex.run();
  // Every node's contribution in node order, so the sum does not depend on
  // arrival order.
  float* mine = piece(me);
  for (int j = 0; j < n; ++j)
    if (j != me) dequantizeAddInt8(mine, mine, in(j), elems(me));
  quantizeInt8(out(me), mine, elems(me));
  dequantizeInt8(mine, out(me), elems(me));

  Exchange back = across.exchange();
  for (int j = 0; j < n; ++j) {
    if (j == me) continue;
    back.send(across.link(j), out(me), p.quantized[me]);
    back.recv(across.link(j), in(j), p.quantized[j]);
  }
  back.run();
  for (int j = 0; j < n; ++j)
    if (j != me) dequantizeInt8(piece(j), in(j), elems(j));
}

}  // namespace

void int8TwoLevelAllreduce(Comm& c, const CollectiveArgs& a, std::vector<char>& scratch) {
  const Hierarchy& h = levelsOf(c);
  if (!h.uniform()) throw std::logic_error("the int8 allreduce needs uniform nodes");
  if (a.count == 0) return;
  Comm local = c.sub(h.nodes[h.myNode]);
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  const Blocks shards = Blocks::even(a.count, local.size(), sizeof(float));
  const int l = local.rank();
  {
    Exchange ex = local.exchange();
    appendReduceScatterAllgather(
        ex, local, {.buf = a.buf, .blocks = &shards, .dt = a.dt, .op = a.op, .allgather = false});
    ex.run();
  }
  int8AcrossNodes(across, reinterpret_cast<float*>(a.buf + shards.offset[l]),
                  shards.length[l] / sizeof(float), scratch);
  Exchange ex = local.exchange();
  appendRing(ex, local, {.buf = a.buf, .blocks = &shards, .reduceScatter = false});
  ex.run();
}

namespace {

class TwoLevelInt8 final : public Algorithm {
 public:
  const char* name() const override { return "two_level_int8"; }
  bool serves(Collective c) const override { return c == Collective::Allreduce; }
  // A group compressed to int8, float32 SUM, several uniform nodes.
  bool canRun(Collective c, const Situation& s) const override {
    return s.int8 && s.g.nodes > 1 && s.g.uniform;
  }
  double estimate(Collective c, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    const int L = s.g.maxLocal, n = s.g.nodes;
    const double wireBytes = 2.0 * (n - 1) / n * bytes * (1.0 + 4.0 / kInt8Block) / 4.0;
    return 2 * (L - 1) * m.intra.alphaUs * 1e-6 + m.intra.bytesSeconds(2.0 * (L - 1) / L * bytes) +
           k.reduceSeconds((L - 1.0) / L * bytes) + 2 * m.inter.alphaUs * 1e-6 +
           m.inter.bytesSeconds(wireBytes) + k.reduceSeconds(4.0 * bytes / L);
  }
  void run(Collective c, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    std::vector<char> own;  // a lone exchange's Comm (tests) has no book
    int8TwoLevelAllreduce(comm, a, comm.book ? comm.book->quantized : own);
  }
  const char* fallback() const override { return "two_level"; }
  bool int8Wire() const override { return true; }
  // Chosen by the int8 rule (select.cpp), never weighed against the rest.
  bool autoCandidate(Collective c, const Situation& s) const override { return false; }
};

}  // namespace

const Algorithm& twoLevelInt8Algorithm() {
  static const TwoLevelInt8 a;
  return a;
}

}  // namespace smdccl
