// Two-level collectives: reduce (or gather) inside each node over shared
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
#include <algorithm>

#include "algorithms/comm.h"
#include "algorithms/cost_model.h"

namespace smdccl {

namespace {

const Hierarchy& levelsOf(const Comm& c) {
  if (!c.levels) throw std::logic_error("two-level algorithm on a Comm without levels");
  return *c.levels;
}

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

// Blocks of `b` picked by rank, re-indexed 0..n-1.
Blocks pick(const Blocks& b, const std::vector<int>& ranks) {
  Blocks out;
  for (int r : ranks) {
    out.offset.push_back(b.offset[r]);
    out.length.push_back(b.length[r]);
  }
  return out;
}

}  // namespace

void twoLevelAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op,
                       size_t chunkBytes) {
  const Hierarchy& h = levelsOf(c);
  if (count == 0 || c.size() == 1) return;
  size_t es = elementSize(dt);
  const int n = h.numNodes(), S = h.maxLocal(), L = h.localSize(), me = h.myLocal;
  Comm local = c.sub(h.nodes[h.myNode]);
  const int myFirst = firstShard(me, L, S), myEnd = firstShard(me + 1, L, S);
  // For each shard this rank owns: its owner on every node, by node.
  std::vector<Comm> across;
  for (int s = myFirst; s < myEnd; ++s) {
    std::vector<int> owners;
    for (int j = 0; j < n; ++j) {
      int Lj = static_cast<int>(h.nodes[j].size());
      owners.push_back(h.nodes[j][ownerOf(s, Lj, S)]);
    }
    across.push_back(c.sub(owners));
  }

  size_t K = pipelineChunks(count * es, chunkBytes);
  Blocks chunks = Blocks::even(count, static_cast<int>(K), es);
  std::vector<Blocks> shardsOf(K), localBlocksOf(K);
  std::vector<int> rsDone(K, -1), interDone(K, -1);
  for (size_t k = 0; k < K; ++k) {
    Blocks sh = Blocks::even(chunks.length[k] / es, S, es);
    for (auto& o : sh.offset) o += chunks.offset[k];
    Blocks lb;
    for (int l = 0; l < L; ++l) {
      int a = firstShard(l, L, S), e = firstShard(l + 1, L, S);
      lb.offset.push_back(sh.offset[a]);
      size_t len = 0;
      for (int s = a; s < e; ++s) len += sh.length[s];
      lb.length.push_back(len);
    }
    shardsOf[k] = std::move(sh);
    localBlocksOf[k] = std::move(lb);
  }

  Exchange ex = c.exchange();
  for (size_t stage = 0; stage < K + 2; ++stage) {
    if (stage < K) {
      size_t k = stage;
      rsDone[k] = appendReduceScatterAllgather(ex, local, buf, localBlocksOf[k], dt, op, true,
                                               false, -1, /*finalReduce=*/n == 1);
    }
    if (stage >= 1 && stage - 1 < K) {
      size_t k = stage - 1;
      // One inter-node ring per owned shard, one after the other: the
      // shards share this rank's uplink anyway.
      int done = rsDone[k];
      for (int s = myFirst; s < myEnd; ++s) {
        Blocks parts = Blocks::even(shardsOf[k].length[s] / es, n, es);
        for (auto& o : parts.offset) o += shardsOf[k].offset[s];
        int last = appendReduceScatterAllgather(ex, across[s - myFirst], buf, parts, dt, op,
                                                true, true, done);
        if (last >= 0) done = last;
      }
      interDone[k] = done;
    }
    if (stage >= 2) {
      size_t k = stage - 2;
      appendRing(ex, local, buf, localBlocksOf[k], dt, op, false, true, interDone[k]);
    }
  }
  ex.run();
}

void twoLevelRdAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  const Hierarchy& h = levelsOf(c);
  Comm local = c.sub(h.nodes[h.myNode]);
  recursiveDoublingAllreduce(local, buf, count, dt, op);
  if (h.numNodes() == 1) return;
  if (h.uniform()) {
    // Every local rank holds the node's sum: all of them cross at once,
    // each with its peers of the same local index, and all end identical.
    Comm across = c.sub(h.acrossNodes(h.myLocal));
    recursiveDoublingAllreduce(across, buf, count, dt, op);
    return;
  }
  // Uneven nodes: the first rank of each node crosses, then tells its node.
  if (h.myLocal == 0) {
    Comm leaders = c.sub(h.acrossNodes(0));
    recursiveDoublingAllreduce(leaders, buf, count, dt, op);
  }
  treeBroadcast(local, buf, count * elementSize(dt), 0);
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
  for (const auto& node : h.nodes)
    intraDone = appendReduceScatterAllgather(ex, local, buf, pick(b, node), dt, op, true, false,
                                             -1, /*finalReduce=*/false);
  appendReduceScatterAllgather(ex, across, buf, pick(b, h.acrossNodes(h.myLocal)), dt, op, true,
                               false, intraDone);
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
  int interDone =
      appendRing(ex, across, buf, pick(b, h.acrossNodes(h.myLocal)), DType::U8, RedOp::Sum, false, true);
  for (const auto& node : h.nodes)
    appendRing(ex, local, buf, pick(b, node), DType::U8, RedOp::Sum, false, true, interDone);
  ex.run();
}

void twoLevelBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  const Hierarchy& h = levelsOf(c);
  // The root speaks for its node; elsewhere the first rank does.
  int rootNode = -1;
  for (int j = 0; j < h.numNodes(); ++j)
    if (std::find(h.nodes[j].begin(), h.nodes[j].end(), c.groupRank(root)) != h.nodes[j].end())
      rootNode = j;
  std::vector<int> leaders = h.acrossNodes(0);
  leaders[rootNode] = c.groupRank(root);
  const auto& mine = h.nodes[h.myNode];
  int myLeader = leaders[h.myNode];
  if (c.groupRank(c.rank()) == myLeader) {
    Comm across = c.sub(leaders);
    treeBroadcast(across, buf, bytes, rootNode);
  }
  Comm local = c.sub(mine);
  int leaderLocal = static_cast<int>(std::find(mine.begin(), mine.end(), myLeader) - mine.begin());
  treeBroadcast(local, buf, bytes, leaderLocal);
}

}  // namespace smdccl
