// Broadcast down a pipelined chain along the ring order: for large
// messages every link is busy and carries ~1x the bytes once the pipeline
// is full (the binomial tree, tree.cpp, takes log2(p) whole-message hops).
#include <algorithm>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"

namespace smdccl {

namespace {
constexpr size_t kChunk = 512 << 10;
}  // namespace

void chainBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  int p = c.size();
  if (p == 1) return;
  // The chain starts at root and follows the ring order from there.
  int rootPos = static_cast<int>(std::find(c.ring.begin(), c.ring.end(), root) - c.ring.begin());
  int pos = c.ringPosition();
  int hop = (pos - rootPos + p) % p;
  Link* prev = hop > 0 ? &c.link(c.ring[(pos - 1 + p) % p]) : nullptr;
  Link* next = hop < p - 1 ? &c.link(c.ring[(pos + 1) % p]) : nullptr;
  size_t chunks = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk);
  Exchange ex = c.exchange();
  // Step k receives chunk k while forwarding chunk k-1.
  for (size_t k = 0; k <= chunks; ++k) {
    if (prev && k < chunks) {
      size_t off = k * kChunk;
      ex.recv(*prev, buf + off, std::min(kChunk, bytes - std::min(bytes, off)));
    }
    if (next && k > 0) {
      size_t off = (k - 1) * kChunk;
      ex.send(*next, buf + off, std::min(kChunk, bytes - std::min(bytes, off)));
    }
    ex.run();
  }
}

namespace {

class Chain final : public Algorithm {
 public:
  const char* name() const override { return "chain"; }
  bool serves(Collective coll) const override { return coll == Collective::Broadcast; }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const GroupShape& g = s.g;
    int p = g.ranks, crossings = g.nodes - 1;
    double hops = (p - 1 - crossings) * m.intra.alphaUs * 1e-6 + crossings * m.inter.alphaUs * 1e-6;
    return hops +
           Costs{m, g}.bottleneck().bytesSeconds(bytes + (p - 2) * std::min<double>(bytes, kChunk));
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    chainBroadcast(comm, a.buf, a.bytes, a.root);
  }
};

}  // namespace

const Algorithm& chainAlgorithm() {
  static const Chain a;
  return a;
}

}  // namespace smdccl
