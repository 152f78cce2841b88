// Two-level collectives (two_level): reduce (or gather) inside each node over shared
// memory, cross the network with one rank per node per shard, spread the
// result inside the node again. A flat ring pushes 2(p-1)/p of an allreduce
// through each node's uplink in p steps; these push 2(n-1)/n in n steps
// (p ranks, n nodes).
//
// The allreduce is pipelined: the message is cut into chunks and all phases
// of all chunks are one streaming exchange, so while chunk k crosses the
// network chunk k+1 is being reduced inside the node and chunk k-1 gathered.
// Transfers are added stage by stage (stage s: intra reduce-scatter of chunk
// s, inter-node rings of chunk s-1, intra allgather of chunk s-2); every
// dependency points to an earlier-added transfer and both ends of a link add
// their halves in the same order, so the earliest unfinished transfer can
// always move: no deadlock, whatever the speeds.
#include <cstdint>
#include <algorithm>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "algorithms/tuning.h"

namespace smdccl {

namespace {

// Shard ownership inside one node of `local` ranks when chunks are cut into
// `shards` (the largest node's rank count): local rank l owns the
// contiguous shards [firstShard(l), firstShard(l+1)).
int firstShard(int l, int local, int shards) {
  return static_cast<int>(static_cast<int64_t>(l) * shards / local);
}
int ownerOf(int shard, int local, int shards) {
  int l = 0;
  while (firstShard(l + 1, local, shards) <= shard) ++l;
  return l;
}


// For each shard [first, end) this rank owns: the group of its owners on
// every node, by node.
std::vector<Comm> acrossComms(Comm& c, const Hierarchy& h, int first, int end, int shards) {
  std::vector<Comm> across;
  for (int s = first; s < end; ++s) {
    std::vector<int> owners;
    for (const auto& node : h.nodes)
      owners.push_back(node[ownerOf(s, static_cast<int>(node.size()), shards)]);
    across.push_back(c.sub(owners));
  }
  return across;
}

// Chunk k's shards (S of them, over the whole node) and its blocks by local
// rank (rank l owns shards [firstShard(l), firstShard(l+1))).
struct ChunkLayout {
  std::vector<Blocks> shards, localBlocks;
};
ChunkLayout layoutChunks(const Blocks& chunks, size_t es, int shards, int local) {
  ChunkLayout out;
  for (size_t k = 0; k < chunks.length.size(); ++k) {
    Blocks sh = Blocks::even(chunks.length[k] / es, shards, es);
    for (auto& o : sh.offset) o += chunks.offset[k];
    Blocks lb;
    for (int l = 0; l < local; ++l) {
      int a = firstShard(l, local, shards), e = firstShard(l + 1, local, shards);
      lb.offset.push_back(sh.offset[a]);
      size_t len = 0;
      for (int s = a; s < e; ++s) len += sh.length[s];
      lb.length.push_back(len);
    }
    out.shards.push_back(std::move(sh));
    out.localBlocks.push_back(std::move(lb));
  }
  return out;
}

// One shard's allreduce across nodes, after transfer `after`; returns its last.
int appendShardAcross(Exchange& ex, Comm& across, const CollectiveArgs& shard,
                      const TwoLevelPipeline& pipeline, int after) {
  const int n = across.size();
  const size_t es = elementSize(shard.dt);
  if (pipeline.across == AcrossNodes::DoubleTree) {
    const double bytes = static_cast<double>(shard.count * es);
    size_t pieces = pipeline.interLink ? doubleTreeChunks(bytes, n, *pipeline.interLink) : 1;
    return appendDoubleTree(ex, across, shard, pieces, after);
  }
  Blocks parts = Blocks::even(shard.count, n, es);
  return appendReduceScatterAllgather(
      ex, across,
      {.buf = shard.buf, .blocks = &parts, .dt = shard.dt, .op = shard.op, .startAfter = after});
}

}  // namespace

void twoLevelAllreduce(Comm& c, const CollectiveArgs& a, const TwoLevelPipeline& pipeline) {
  const Hierarchy& h = levelsOf(c);
  if (a.count == 0 || c.size() == 1) return;
  const size_t es = elementSize(a.dt);
  const int n = h.numNodes(), S = h.maxLocal(), L = h.localSize(), me = h.myLocal;
  Comm local = c.sub(h.nodes[h.myNode]);
  const int myFirst = firstShard(me, L, S), myEnd = firstShard(me + 1, L, S);
  std::vector<Comm> across = acrossComms(c, h, myFirst, myEnd, S);
  const size_t K = pipelineChunks(a.count * es, pipeline.chunkBytes);
  const ChunkLayout layout =
      layoutChunks(Blocks::even(a.count, static_cast<int>(K), es), es, S, L);
  std::vector<int> rsDone(K, -1), interDone(K, -1);
  Exchange ex = c.exchange();
  for (size_t stage = 0; stage < K + 2; ++stage) {
    if (stage < K) {
      rsDone[stage] = appendReduceScatterAllgather(ex, local,
                                                   {.buf = a.buf,
                                                    .blocks = &layout.localBlocks[stage],
                                                    .dt = a.dt,
                                                    .op = a.op,
                                                    .allgather = false,
                                                    .finalReduce = n == 1});
    }
    if (stage >= 1 && stage - 1 < K) {
      // One inter-node schedule per owned shard, one after the other: the
      // shards share this rank's uplink anyway.
      const size_t k = stage - 1;
      int done = rsDone[k];
      for (int s = myFirst; s < myEnd; ++s) {
        const Blocks& sh = layout.shards[k];
        int last = appendShardAcross(
            ex, across[s - myFirst],
            {.buf = a.buf + sh.offset[s], .count = sh.length[s] / es, .dt = a.dt, .op = a.op},
            pipeline, done);
        if (last >= 0) done = last;
      }
      interDone[k] = done;
    }
    if (stage >= 2) {
      appendRing(ex, local,
                 {.buf = a.buf,
                  .blocks = &layout.localBlocks[stage - 2],
                  .dt = a.dt,
                  .op = a.op,
                  .reduceScatter = false,
                  .startAfter = interDone[stage - 2]});
    }
  }
  ex.run();
}

void twoLevelReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op) {
  const Hierarchy& h = levelsOf(c);
  if (!h.uniform()) throw std::logic_error("two-level reduce-scatter needs uniform nodes");
  Comm local = c.sub(h.nodes[h.myNode]);
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  Exchange ex = c.exchange();
  // Inside the node, for every node j: local rank l ends up with the node's
  // sum of block (j, l). Then ranks of local index l reduce-scatter those
  // over the nodes: each ends with its own block, fully reduced.
  int intraDone = -1;
  for (const auto& node : h.nodes) {  // all of them, on whatever links they ended
    Blocks mine = pickBlocks(b, node);
    intraDone = ex.join(intraDone, appendReduceScatterAllgather(ex, local,
                                                                {.buf = buf,
                                                                 .blocks = &mine,
                                                                 .dt = dt,
                                                                 .op = op,
                                                                 .allgather = false,
                                                                 .finalReduce = false}));
  }
  Blocks acrossBlocks = pickBlocks(b, h.acrossNodes(h.myLocal));
  appendReduceScatterAllgather(ex, across,
                               {.buf = buf,
                                .blocks = &acrossBlocks,
                                .dt = dt,
                                .op = op,
                                .allgather = false,
                                .startAfter = intraDone});
  ex.run();
}

void twoLevelAllgather(Comm& c, char* buf, const Blocks& b) {
  const Hierarchy& h = levelsOf(c);
  if (!h.uniform()) throw std::logic_error("two-level allgather needs uniform nodes");
  Comm local = c.sub(h.nodes[h.myNode]);
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  Exchange ex = c.exchange();
  // Across nodes first (each rank's block crosses once per node), then every
  // node's blocks are spread inside each node.
  Blocks acrossBlocks = pickBlocks(b, h.acrossNodes(h.myLocal));
  int interDone =
      appendRing(ex, across, {.buf = buf, .blocks = &acrossBlocks, .reduceScatter = false});
  for (const auto& node : h.nodes) {
    Blocks mine = pickBlocks(b, node);
    appendRing(ex, local,
               {.buf = buf, .blocks = &mine, .reduceScatter = false, .startAfter = interDone});
  }
  ex.run();
}

namespace {

double twoLevelRingSeconds(double bytes, const Costs& k, size_t chunkBytes) {
  const CostModel& m = k.m;
  int L = k.g.maxLocal, n = k.g.nodes;
  double A =
      m.intra.bytesSeconds(2.0 * (L - 1) / L * bytes) + k.reduceSeconds((L - 1.0) / L * bytes);
  // Each node's uplink carries 2(n-1)/n of the message, whatever L is.
  double E =
      m.inter.bytesSeconds(2.0 * (n - 1) / n * bytes) + k.reduceSeconds((n - 1.0) / n * bytes / L);
  double K = static_cast<double>(pipelineChunks(static_cast<size_t>(bytes), chunkBytes));
  double latency = 2 * (L - 1) * m.intra.alphaUs * 1e-6 + 2 * (n - 1) * m.inter.alphaUs * 1e-6;
  return latency + std::max(A, E) + std::min(A, E) / K +
         (K - 1) * 2 * (n - 1 + L - 1) * kPerMessageUs * 1e-6;
}

class TwoLevel final : public Algorithm {
 public:
  const char* name() const override { return "two_level"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::ReduceScatter ||
           coll == Collective::Allgather;
  }
  // Several nodes with several ranks; reduce-scatter and allgather need
  // every node the same size.
  bool canRun(Collective coll, const Situation& s) const override {
    return !s.subgroup && s.g.nodes > 1 && s.g.maxLocal > 1 &&
           (coll == Collective::Allreduce || s.g.uniform);
  }
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    Costs k{m, s.g};
    int L = s.g.maxLocal, n = s.g.nodes;
    switch (coll) {
      case Collective::Allreduce: return twoLevelRingSeconds(bytes, k, s.pipelineChunkBytes);
      case Collective::ReduceScatter:
        return (L - 1) * m.intra.alphaUs * 1e-6 + m.intra.bytesSeconds((L - 1.0) / L * bytes) +
               k.reduceSeconds((L - 1.0) / L * bytes) + (n - 1) * m.inter.alphaUs * 1e-6 +
               m.inter.bytesSeconds((n - 1.0) / n * bytes) +
               k.reduceSeconds((n - 1.0) / n * bytes / L);
      default:
        return (L - 1) * m.intra.alphaUs * 1e-6 + m.intra.bytesSeconds((L - 1.0) / L * bytes) +
               (n - 1) * m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds((n - 1.0) / n * bytes);
    }
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    switch (coll) {
      case Collective::Allreduce:
        twoLevelAllreduce(comm, a, {.chunkBytes = t.pipelineChunkBytes});
        break;
      case Collective::ReduceScatter:
        twoLevelReduceScatter(comm, a.buf, *a.blocks, a.dt, a.op);
        break;
      default: twoLevelAllgather(comm, a.buf, *a.blocks); break;
    }
  }
  const char* fallback() const override { return "ring"; }
  const char* kin(Collective coll) const override {
    return coll == Collective::Broadcast ? "two_level_tree" : nullptr;
  }
};

}  // namespace

const Algorithm& twoLevelAlgorithm() {
  static const TwoLevel a;
  return a;
}

}  // namespace smdccl
