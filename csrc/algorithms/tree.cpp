// Trees: the pipelined double binary tree allreduce (NCCL's since 2.4), and
// the binomial broadcast and reduce.
//
// Double binary tree: two binary trees over the same ranks, each carrying
// half of the message. Tree 0 is the in-order tree over 0..p-1, where odd
// ranks are leaves; tree 1 is tree 0 shifted by one rank, where they are
// interior. A rank therefore forwards for at most about one tree, and each
// sends and receives about the message size in all, while the latency grows
// with the depth, log2(p), instead of a ring's p. Each half is cut into
// chunks that flow up (reduced at every interior rank) and back down (the
// root's result) at once; every transfer also streams, forwarding what its
// predecessor has received so far.
//
// Every rank ends with the root's bits: the root rounds its sums to the
// wire the result travels on (Comm::resultWire), and everything below
// forwards those values unchanged.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"

namespace smdccl {

namespace {

// The in-order tree over 0..p-1: a rank's level is its lowest set bit; rank
// 0 is the root, with one child (the highest power of two below p).
TreeLinks inOrderTree(int r, int p) {
  TreeLinks t;
  if (p <= 1) return t;
  if (r == 0) {
    int bit = 1;
    while (bit * 2 < p) bit *= 2;
    t.child0 = bit;
    return t;
  }
  int low = r & -r;
  int up = (r ^ low) | (low << 1);
  t.parent = up < p ? up : (r ^ low);
  int half = low >> 1;
  if (half) {
    t.child0 = r - half;
    while (half && r + half >= p) half >>= 1;
    t.child1 = half ? r + half : -1;
  }
  return t;
}

}  // namespace

TreeLinks binaryTreeLinks(int r, int p, int tree) {
  if (tree == 0) return inOrderTree(r, p);
  // Tree 1: position x holds rank (x + 1) mod p.
  TreeLinks at = inOrderTree((r - 1 + p) % p, p);
  auto rankOf = [p](int x) { return x < 0 ? -1 : (x + 1) % p; };
  return {rankOf(at.parent), rankOf(at.child0), rankOf(at.child1)};
}

// The pipeline: 2*depth + K - 1 steps; in each, the busiest rank (interior
// in one tree, a leaf in the other) moves four pieces of bytes/(2K): up to
// its parent and down to two children in one tree, up in the other.
size_t doubleTreeChunks(double bytes, int p, const LevelCost& link) {
  int depth = std::max(1, ceilLog2(p));
  double alpha = std::max(link.alphaUs, kPerMessageUs) * 1e-6;
  double k = std::sqrt((2 * depth - 1) * 2 * bytes / (alpha * link.gbps * 1e9));
  constexpr double kMinChunkBytes = 8 << 10;  // per tree
  k = std::min({k, bytes / (2 * kMinChunkBytes), 64.0});
  return static_cast<size_t>(std::max(1.0, std::round(k)));
}

double doubleTreeSeconds(double bytes, int p, const LevelCost& link, double reduceGbps) {
  if (p <= 1) return 0;
  int depth = ceilLog2(p);
  double K = static_cast<double>(doubleTreeChunks(bytes, p, link));
  double perStep = link.bytesSeconds((p == 2 ? 1 : 2) * bytes / K);
  return (2 * depth + K - 1) * (link.alphaUs * 1e-6 + perStep) + bytes / (reduceGbps * 1e9);
}

int appendDoubleTree(Exchange& ex, Comm& c, const CollectiveArgs& a, size_t chunks,
                     int startAfter) {
  char* buf = a.buf;
  const size_t count = a.count;
  const DType dt = a.dt;
  const RedOp op = a.op;
  const int p = c.size();
  if (p == 1 || count == 0) return -1;
  const int r = c.rank();
  const size_t es = elementSize(dt);
  const bool f32 = dt == DType::F32;
  const Wire roundFinal = c.resultWire(dt);
  auto wireTo = [&](int peer) { return f32 ? c.wireTo(peer) : Wire::F32; };
  Blocks halves = Blocks::even(count, 2, es);
  Blocks pieces[2];
  TreeLinks tree[2];
  for (int t = 0; t < 2; ++t) {
    pieces[t] = Blocks::even(halves.length[t] / es, static_cast<int>(chunks), es);
    for (auto& o : pieces[t].offset) o += halves.offset[t];
    tree[t] = binaryTreeLinks(r, p, t);
  }
  int done[2] = {-1, -1};
  // Per chunk and tree: the reduce the send up streams behind, the send up.
  std::vector<int> upSent(2 * chunks, -1), upSum(2 * chunks, -1);
  // A link direction can carry one tree's partial sums up and the other's
  // results down. Its messages keep the order they were added in, so a
  // chunk's result must be added after the partial sums of the chunks that
  // flow while it makes its round trip: else those wait behind it, and
  // every chunk costs a whole round trip. Stage s adds chunk s's way up and
  // chunk s - lag's way down (both trees), the same on every rank.
  const size_t lag = std::min(chunks, static_cast<size_t>(2 * std::max(1, ceilLog2(p))));
  for (size_t stage = 0; stage < chunks + lag; ++stage) {
    for (int t = 0; t < 2 && stage < chunks; ++t) {
      const size_t k = stage;
      const TreeLinks& tl = tree[t];
      char* at = buf + pieces[t].offset[k];
      size_t len = pieces[t].length[k];
      // Up: the children's partial sums into ours, one child after the
      // other (a fixed order: the same bits whatever arrives first).
      int sum = -1;
      for (int child : {tl.child0, tl.child1}) {
        if (child < 0) continue;
        bool last = child == tl.child1 || tl.child1 < 0;
        int idx = ex.size();
        ex.recvReduce(c.link(child), at, len,
                      {dt, op, wireTo(child), tl.parent < 0 && last ? roundFinal : Wire::F32},
                      {sum < 0 ? startAfter : sum, -1});
        sum = idx;
      }
      upSum[2 * k + t] = sum;
      if (tl.parent >= 0) {
        upSent[2 * k + t] = ex.size();
        // Streams behind the last child's reduce (which starts after the first's).
        ex.send(c.link(tl.parent), at, len,
                sum < 0 ? ExchangeDeps{startAfter, -1} : ExchangeDeps{-1, sum}, wireTo(tl.parent));
      }
    }
    for (int t = 0; t < 2 && stage >= lag; ++t) {
      const size_t k = stage - lag;
      const TreeLinks& tl = tree[t];
      char* at = buf + pieces[t].offset[k];
      size_t len = pieces[t].length[k];
      int result = upSum[2 * k + t];  // the root's sums are the result
      if (tl.parent >= 0) {
        result = ex.size();
        ex.recv(c.link(tl.parent), at, len, {upSent[2 * k + t], -1}, wireTo(tl.parent));
      }
      // Down: forward the result while it arrives.
      for (int child : {tl.child0, tl.child1}) {
        if (child < 0) continue;
        ex.send(c.link(child), at, len, {-1, result}, wireTo(child));
      }
      // A later chunk's result on the same link implies this one's.
      done[t] = result;
    }
  }
  return ex.join(done[0], done[1]);
}

void treeBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  int p = c.size();
  if (p == 1) return;
  int vr = (c.rank() - root + p) % p;
  Exchange ex = c.exchange();
  int mask = 1;
  while (mask < p) mask <<= 1;
  // Receive from the parent (the rank that differs in our lowest set bit)...
  for (int m = 1; m < p; m <<= 1) {
    if (vr & m) {
      ex.recv(c.link(((vr - m) + root) % p), buf, bytes).run();
      break;
    }
  }
  // ...then send to children, largest subtree first.
  int low = vr == 0 ? mask : (vr & -vr);
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (vr + m < p) ex.send(c.link((vr + m + root) % p), buf, bytes);
  ex.run();
}

void treeReduce(Comm& c, const CollectiveArgs& a) {
  char* buf = a.buf;
  const size_t count = a.count;
  const DType dt = a.dt;
  const RedOp op = a.op;
  const int root = a.root;
  int p = c.size();
  if (p == 1 || count == 0) return;
  int vr = (c.rank() - root + p) % p;
  size_t bytes = count * elementSize(dt);
  bool f32 = dt == DType::F32;
  Exchange ex = c.exchange();
  // The mirror of treeBroadcast: children's sums in, smallest subtree
  // first (a fixed order), then ours to the parent.
  int last = -1;
  for (int m = 1; m < p; m <<= 1) {
    if (vr & m) {
      int parent = (vr - m + root) % p;
      ex.send(c.link(parent), buf, bytes, {last, -1}, f32 ? c.wireTo(parent) : Wire::F32);
      break;
    }
    if (vr + m < p) {
      int child = (vr + m + root) % p;
      int idx = ex.size();
      ex.recvReduce(c.link(child), buf, bytes, {dt, op, f32 ? c.wireTo(child) : Wire::F32},
                    {last, -1});
      last = idx;
    }
  }
  ex.run();
}

namespace {

class Tree final : public Algorithm {
 public:
  const char* name() const override { return "tree"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::Broadcast ||
           coll == Collective::Reduce;
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    switch (coll) {
      case Collective::Allreduce:
        return doubleTreeSeconds(bytes, s.g.ranks, k.bottleneck(), m.reduceGbps);
      case Collective::Broadcast: return k.binomialTree(bytes);
      default: return k.binomialTree(bytes) + ceilLog2(s.g.ranks) * k.reduceSeconds(bytes);
    }
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    switch (coll) {
      case Collective::Allreduce: {
        double bytes = static_cast<double>(a.count * elementSize(a.dt));
        const LevelCost& link =
            comm.levels && comm.levels->numNodes() > 1 ? t.model.inter : t.model.intra;
        Exchange ex = comm.exchange();
        appendDoubleTree(ex, comm, a, doubleTreeChunks(bytes, comm.size(), link));
        ex.run();
        break;
      }
      case Collective::Broadcast: treeBroadcast(comm, a.buf, a.bytes, a.root); break;
      default: treeReduce(comm, a); break;
    }
  }
  const char* kin(Collective coll) const override {
    return coll == Collective::ReduceScatter ? "halving"
           : coll == Collective::Allgather   ? "ring"
                                             : nullptr;
  }
};

}  // namespace

const Algorithm& treeAlgorithm() {
  static const Tree a;
  return a;
}

}  // namespace smdccl
