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
//
// The reduce-scatter (FSDP's gradients) is steps 1 and 2 over the ranks'
// blocks: each rank keeps its own block, so one quantization per element;
// pipelined like the allreduce, a piece of every block per chunk.
#include <cmath>
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/cost_model.h"
#include "algorithms/tuning.h"
#include "kernels/cpu/quantize.h"

namespace smdccl {

namespace {

// One pipeline chunk as this rank sees it: the chunk's elements, this
// rank's shard of them (after the node's reduce-scatter), the shard's
// pieces by owning node.
struct Chunk {
  size_t first = 0, count = 0;  // elements of the tensor
  Blocks shards;                // byte ranges of the tensor, by local rank
  Blocks pieces;                // byte ranges of the tensor, by node (this rank's shard)
  std::vector<size_t> quantized;  // int8Bytes of each piece
};

// One round with every other node of `across`: to node j what send(j)
// gives, from it into what recv(j) gives ({bytes, size} each).
template <typename Send, typename Recv>
void withOtherNodes(Exchange& ex, Comm& across, Send send, Recv recv) {
  for (int j = 0; j < across.size(); ++j) {
    if (j == across.rank()) continue;
    const auto [out, outBytes] = send(j);
    const auto [in, inBytes] = recv(j);
    ex.send(across.link(j), out, outBytes);
    ex.recv(across.link(j), in, inBytes);
  }
}

// Quantizes `x` once into `q`; with error feedback (residual), what the
// last step rounded away here is added first, and what this one rounds
// away kept. A value the step could not carry (inf or NaN, whose block
// decodes to NaN: a loss scaler's overflowed step, which it skips) leaves
// no residual, or it would make every later step non-finite.
void quantize(char* q, float* x, size_t count, float* residual) {
  if (residual)
    for (size_t i = 0; i < count; ++i) x[i] += residual[i];
  quantizeInt8(q, x, count);
  if (residual) {
    dequantizeInt8(residual, q, count);
    for (size_t i = 0; i < count; ++i) {
      const float r = x[i] - residual[i];
      residual[i] = std::isfinite(r) ? r : 0.0f;
    }
  }
}

// A reduce-scatter's error feedback, compact: the residuals of the blocks
// this rank quantizes for the other nodes' owners only, in node order
// (byNode: node j's block; this rank's own, `me`, is skipped), so they take
// (n-1)/n of the blocks' memory. Fitted here, where the layout is known; it
// is the same every step.
class SentResiduals {
 public:
  SentResiduals(const Int8Feedback& f, const Blocks& byNode, int me) {
    if (!f) return;
    if (f.first != 0) throw std::logic_error("a reduce-scatter's feedback starts at its element 0");
    size_t total = 0;
    for (size_t j = 0; j < byNode.length.size(); ++j) {
      at_.push_back(total);
      if (static_cast<int>(j) != me) total += byNode.length[j] / sizeof(float);
    }
    f.residuals->fit(total, /*withOwned=*/false);
    base_ = f.residuals->sent.data();
  }
  // Value e of node j's block (nullptr: no feedback).
  float* at(int j, size_t e) const {
    return base_ ? base_ + at_[static_cast<size_t>(j)] + e : nullptr;
  }

 private:
  std::vector<size_t> at_;
  float* base_ = nullptr;
};

Chunk chunkOf(size_t first, size_t count, int L, int l, int n) {
  Chunk k{first, count, Blocks::even(count, L, sizeof(float)), {}, {}};
  for (size_t& o : k.shards.offset) o += first * sizeof(float);
  k.pieces = Blocks::even(k.shards.length[l] / sizeof(float), n, sizeof(float));
  for (int j = 0; j < n; ++j) {
    k.pieces.offset[j] += k.shards.offset[l];
    k.quantized.push_back(int8Bytes(k.pieces.length[j] / sizeof(float)));
  }
  return k;
}

// The pipeline of one allreduce: chunk k's node reduce-scatter runs with
// chunk k-1's pieces on their way to their owners, chunk k-2's sums on
// their way back and chunk k-3's node allgather, in one exchange per stage;
// between stages this rank quantizes, adds and decodes. Each chunk's
// quantized pieces live in one of three scratch slots (a chunk is in flight
// for three stages).
class Int8Pipeline {
 public:
  // local: this rank's node; across: the ranks of its local index, by node.
  Int8Pipeline(Comm& c, Comm local, Comm across, const CollectiveArgs& a, const Int8Run& run)
      : c_(c), a_(a), run_(run), local_(std::move(local)), across_(std::move(across)) {
    const int L = local_.size(), n = across_.size();
    const Blocks cut = Blocks::even(a.count, static_cast<int>(pipelineChunks(
                                                 a.count * sizeof(float), run.chunkBytes)),
                                    sizeof(float));
    size_t most = 0;
    for (size_t i = 0; i < cut.offset.size(); ++i) {
      chunks_.push_back(chunkOf(cut.offset[i] / sizeof(float), cut.length[i] / sizeof(float), L,
                                local_.rank(), n));
      for (size_t q : chunks_.back().quantized) most = std::max(most, q);
    }
    slotBytes_ = most;
    run.scratch.resize(3 * 2 * static_cast<size_t>(n) * slotBytes_);
    if (run.feedback && !run.feedback.covers(a.count))
      throw std::logic_error("the int8 error feedback's residuals do not cover the tensor");
  }

  void run() {
    const int K = static_cast<int>(chunks_.size());
    for (int s = 0; s < K + 3; ++s) {
      if (s - 3 >= 0 && s - 3 < K) decodeReceived(chunks_[s - 3], s - 3);
      if (s - 2 >= 0 && s - 2 < K) sumAndQuantize(chunks_[s - 2], s - 2);
      if (s - 1 >= 0 && s - 1 < K) quantizePieces(chunks_[s - 1], s - 1);
      Exchange ex = c_.exchange();
      if (s < K)
        appendReduceScatterAllgather(ex, local_,
                                     {.buf = a_.buf, .blocks = &chunks_[s].shards, .dt = a_.dt,
                                      .op = a_.op, .allgather = false});
      if (s - 1 >= 0 && s - 1 < K) toOwners(ex, chunks_[s - 1], s - 1);
      if (s - 2 >= 0 && s - 2 < K) fromOwners(ex, chunks_[s - 2], s - 2);
      if (s - 3 >= 0 && s - 3 < K)
        appendRing(ex, local_, {.buf = a_.buf, .blocks = &chunks_[s - 3].shards,
                                .reduceScatter = false});
      ex.run();
    }
  }

 private:
  // Slot k % 3: n outgoing pieces (by owner; this rank's own: its sum),
  // then n incoming ones (by sender).
  char* out(int k, int j) { return slot(k) + static_cast<size_t>(j) * slotBytes_; }
  char* in(int k, int j) { return slot(k) + static_cast<size_t>(across_.size() + j) * slotBytes_; }
  char* slot(int k) {
    return run_.scratch.data() + static_cast<size_t>(k % 3) * 2 * across_.size() * slotBytes_;
  }
  float* values(const Chunk& k, int j) {
    return reinterpret_cast<float*>(a_.buf + k.pieces.offset[j]);
  }
  size_t elems(const Chunk& k, int j) const { return k.pieces.length[j] / sizeof(float); }
  size_t index(const Chunk& k, int j) const { return k.pieces.offset[j] / sizeof(float); }

  void quantizePieces(const Chunk& k, int ki) {
    const int me = across_.rank();
    for (int j = 0; j < across_.size(); ++j)
      if (j != me)
        quantize(out(ki, j), values(k, j), elems(k, j),
                 run_.feedback ? run_.feedback.sent(index(k, j)) : nullptr);
  }

  // Each other node's piece to it; theirs of this rank's piece from them.
  void toOwners(Exchange& ex, const Chunk& k, int ki) {
    const size_t mine = k.quantized[across_.rank()];
    withOtherNodes(
        ex, across_, [&](int j) { return std::pair(out(ki, j), k.quantized[j]); },
        [&](int j) { return std::pair(in(ki, j), mine); });
  }

  // Every node's contribution in node order (the sum does not depend on
  // arrival order), then the sum quantized once; the owner keeps the
  // decoded values, which every other rank receives.
  void sumAndQuantize(const Chunk& k, int ki) {
    const int me = across_.rank();
    float* mine = values(k, me);
    const size_t m = elems(k, me);
    for (int j = 0; j < across_.size(); ++j)
      if (j != me) dequantizeAddInt8(mine, mine, in(ki, j), m);
    quantize(out(ki, me), mine, m, run_.feedback ? run_.feedback.owned(index(k, me)) : nullptr);
    dequantizeInt8(mine, out(ki, me), m);
  }

  // This rank's sum to every other node; theirs from them.
  void fromOwners(Exchange& ex, const Chunk& k, int ki) {
    const int me = across_.rank();
    withOtherNodes(
        ex, across_, [&](int) { return std::pair(out(ki, me), k.quantized[me]); },
        [&](int j) { return std::pair(in(ki, j), k.quantized[j]); });
  }

  void decodeReceived(const Chunk& k, int ki) {
    for (int j = 0; j < across_.size(); ++j)
      if (j != across_.rank()) dequantizeInt8(values(k, j), in(ki, j), elems(k, j));
  }

  Comm& c_;
  const CollectiveArgs& a_;
  const Int8Run& run_;
  Comm local_, across_;
  std::vector<Chunk> chunks_;
  size_t slotBytes_ = 0;
};

// Every other node's quantized contribution to this rank's piece (count
// values) posted on `ex`: `sent(j)` gives the quantized piece for node j
// ({bytes, size}); `inbox` takes the contributions (a piece of
// int8Bytes(count) per node).
template <typename Sent>
void postToOwners(Exchange& ex, Comm& across, Sent sent, size_t count, char* inbox) {
  const size_t each = int8Bytes(count);
  withOtherNodes(ex, across, sent,
                 [&](int j) { return std::pair(inbox + static_cast<size_t>(j) * each, each); });
}

// ... once they arrived: added to `mine` in node order (the sum does not
// depend on arrival order).
void addContributions(Comm& across, float* mine, size_t count, const char* inbox) {
  const size_t each = int8Bytes(count);
  for (int j = 0; j < across.size(); ++j)
    if (j != across.rank())
      dequantizeAddInt8(mine, mine, inbox + static_cast<size_t>(j) * each, count);
}

template <typename Sent>
void addFromOthers(Comm& across, Sent sent, float* mine, size_t count, char* inbox) {
  Exchange ex = across.exchange();
  postToOwners(ex, across, sent, count, inbox);
  ex.run();
  addContributions(across, mine, count, inbox);
}

// Across nodes (the ranks of `across`, one per node): block j of buf
// (byNode) goes to its owner j quantized once; the owner adds every
// contribution to its own in float32. One quantization per element; each
// rank keeps its own block, so no second. With feedback, SentResiduals.
void int8ToOwners(Comm& across, char* buf, const Blocks& byNode, std::vector<char>& scratch,
                  const Int8Feedback& feedback) {
  const int n = across.size(), me = across.rank();
  auto count = [&](int j) { return byNode.length[j] / sizeof(float); };
  const SentResiduals residuals(feedback, byNode, me);
  auto block = [&](int j) { return reinterpret_cast<float*>(buf + byNode.offset[j]); };
  std::vector<size_t> at(static_cast<size_t>(n) + 1, 0);  // the pieces for the others, by node
  for (int j = 0; j < n; ++j) at[j + 1] = at[j] + int8Bytes(count(j));
  scratch.resize(at[n] + static_cast<size_t>(n) * int8Bytes(count(me)));  // then the inbox
  addFromOthers(
      across,
      [&](int j) {
        quantize(scratch.data() + at[j], block(j), count(j), residuals.at(j, 0));
        return std::pair(scratch.data() + at[j], at[j + 1] - at[j]);
      },
      block(me), count(me), scratch.data() + at[n]);
}

// The two-level reduce-scatter's pipeline: every rank's block is cut into
// K pieces, chunk k being piece k of every block. Chunk k's node
// reduce-scatter runs with chunk k-1's pieces on their way to their
// owners, in one exchange per stage; between stages this rank quantizes
// chunk k's pieces for the other nodes (once) and adds what the other
// nodes sent it of chunk k-1.
class Int8ReduceScatterPipeline {
 public:
  Int8ReduceScatterPipeline(Comm& c, const CollectiveArgs& a, const Int8Run& run)
      : c_(c),
        h_(levelsOf(c)),
        buf_(a.buf),
        scratch_(run.scratch),
        blocks_(*a.blocks),
        local_(c.sub(h_.nodes[h_.myNode])),
        across_(c.sub(h_.acrossNodes(h_.myLocal))),
        owners_(h_.acrossNodes(h_.myLocal)),
        residuals_(run.feedback, pickBlocks(blocks_, owners_), across_.rank()) {
    const Blocks& b = blocks_;
    // No more pieces than the smallest block has values: only an empty
    // block has empty pieces.
    size_t k = pipelineChunks(b.total(), run.chunkBytes);
    for (size_t len : b.length)
      if (len) k = std::min(k, len / sizeof(float));
    size_t most = 0;
    for (size_t i = 0; i < k; ++i) {
      Blocks chunk = b;
      for (size_t r = 0; r < b.length.size(); ++r) {
        const Blocks pieces = Blocks::even(b.length[r] / sizeof(float), static_cast<int>(k), 4);
        chunk.offset[r] = b.offset[r] + pieces.offset[i];
        chunk.length[r] = pieces.length[i];
        most = std::max(most, int8Bytes(chunk.length[r] / sizeof(float)));
      }
      chunks_.push_back(std::move(chunk));
    }
    slotBytes_ = most;
    scratch_.resize(2 * static_cast<size_t>(across_.size()) * slotBytes_);
  }

  void run() {
    const int K = static_cast<int>(chunks_.size());
    for (int s = 0; s <= K; ++s) {
      Exchange ex = c_.exchange();
      if (s < K) nodeReduceScatter(ex, chunks_[s]);
      if (s > 0) toOwners(ex, chunks_[s - 1]);
      ex.run();
      if (s > 0) {
        const Blocks& done = chunks_[s - 1];
        addContributions(across_, piece(done, c_.rank()), count(done, c_.rank()), inbox());
      }
    }
  }

 private:
  // Inside the node, for every node j: local rank l gets the node's sum of
  // this chunk's piece of node j's rank l.
  void nodeReduceScatter(Exchange& ex, const Blocks& chunk) {
    for (const auto& node : h_.nodes) {
      Blocks theirs = pickBlocks(chunk, node);
      appendReduceScatterAllgather(ex, local_,
                                   {.buf = buf_,
                                    .blocks = &theirs,
                                    .dt = DType::F32,
                                    .op = RedOp::Sum,
                                    .allgather = false,
                                    .finalReduce = false});
    }
  }
  // The node sums of the other nodes' owners' pieces, quantized once, to
  // them; theirs of this rank's piece from them.
  void toOwners(Exchange& ex, const Blocks& chunk) {
    postToOwners(
        ex, across_,
        [&](int j) {
          const size_t owner = static_cast<size_t>(owners_[static_cast<size_t>(j)]);
          const size_t within = (chunk.offset[owner] - blocks_.offset[owner]) / sizeof(float);
          quantize(out(j), piece(chunk, static_cast<int>(owner)),
                   count(chunk, static_cast<int>(owner)), residuals_.at(j, within));
          return std::pair(out(j), int8Bytes(count(chunk, owner)));
        },
        count(chunk, c_.rank()), inbox());
  }
  float* piece(const Blocks& chunk, int rank) const {
    return reinterpret_cast<float*>(buf_ + chunk.offset[static_cast<size_t>(rank)]);
  }
  static size_t count(const Blocks& chunk, int rank) {
    return chunk.length[static_cast<size_t>(rank)] / sizeof(float);
  }
  // n outgoing pieces (by node), then room for n incoming (postToOwners' inbox).
  char* out(int j) { return scratch_.data() + static_cast<size_t>(j) * slotBytes_; }
  char* inbox() { return out(across_.size()); }

  Comm& c_;
  const Hierarchy& h_;
  char* buf_;
  std::vector<char>& scratch_;
  const Blocks& blocks_;
  Comm local_, across_;
  std::vector<int> owners_;  // group rank of this rank's local index on each node
  SentResiduals residuals_;
  std::vector<Blocks> chunks_;
  size_t slotBytes_ = 0;
};

}  // namespace

void int8TwoLevelReduceScatter(Comm& c, const CollectiveArgs& a, const Int8Run& run) {
  if (!levelsOf(c).uniform()) throw std::logic_error("the int8 reduce-scatter needs uniform nodes");
  Int8ReduceScatterPipeline(c, a, run).run();
}

void int8AcrossReduceScatter(Comm& c, const CollectiveArgs& a, const Int8Run& run) {
  int8ToOwners(c, a.buf, *a.blocks, run.scratch, run.feedback);
}

void int8AcrossPackedReduceScatter(Comm& c, char* slot, const Int8Slot& s,
                                   std::vector<char>& scratch) {
  const size_t mine = s.counts[c.rank()];
  scratch.resize(static_cast<size_t>(c.size()) * int8Bytes(mine));  // the inbox
  addFromOthers(
      c, [&](int j) { return std::pair(slot + s.offsets[j], int8Bytes(s.counts[j])); },
      reinterpret_cast<float*>(slot + s.offsets[c.rank()]), mine, scratch.data());
}

void int8AcrossPackedAllreduce(Comm& c, char* slot, const Int8Slot& s, std::vector<char>& scratch) {
  int8AcrossPackedReduceScatter(c, slot, s, scratch);
  // The owner's sum quantized once (as its piece's bytes, which it decodes
  // like every other rank), and every owner's to every rank.
  const int me = c.rank();
  const size_t bytes = int8Bytes(s.counts[me]);
  scratch.resize(bytes);
  quantizeInt8(scratch.data(), reinterpret_cast<float*>(slot + s.offsets[me]), s.counts[me]);
  std::memcpy(slot + s.offsets[me], scratch.data(), bytes);
  Exchange ex = c.exchange();
  withOtherNodes(
      ex, c, [&](int) { return std::pair(slot + s.offsets[me], bytes); },
      [&](int j) { return std::pair(slot + s.offsets[j], int8Bytes(s.counts[j])); });
  ex.run();
}

Int8Parts int8Parts(Collective coll, double bytes, const Situation& s, const CostModel& m) {
  Costs k{m, s.g};
  const int L = s.g.maxLocal, n = s.g.nodes;
  const double phases = coll == Collective::ReduceScatter ? 1.0 : 2.0;
  const double wireBytes = phases * (n - 1) / n * bytes * (1.0 + 4.0 / kInt8Block) / 4.0;
  return {.intraAlphas = 2 * (L - 1) * m.intra.alphaUs * 1e-6,
          .intra = m.intra.bytesSeconds(2.0 * (L - 1) / L * bytes) +
                   k.reduceSeconds((L - 1.0) / L * bytes),
          .interAlpha = m.inter.alphaUs * 1e-6,
          .inter = m.inter.bytesSeconds(wireBytes) + k.reduceSeconds(4.0 * bytes / L)};
}

void int8TwoLevelAllreduce(Comm& c, const CollectiveArgs& a, const Int8Run& run) {
  const Hierarchy& h = levelsOf(c);
  if (!h.uniform()) throw std::logic_error("the int8 allreduce needs uniform nodes");
  if (a.count == 0) return;
  Int8Pipeline(c, c.sub(h.nodes[h.myNode]), c.sub(h.acrossNodes(h.myLocal)), a, run).run();
}

void int8AcrossAllreduce(Comm& c, const CollectiveArgs& a, const Int8Run& run) {
  if (a.count == 0) return;
  Int8Pipeline(c, c.sub({c.rank()}), c, a, run).run();
}

namespace {

class TwoLevelInt8 final : public Algorithm {
 public:
  const char* name() const override { return "two_level_int8"; }
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::ReduceScatter;
  }
  // A group compressed to int8, float32 SUM, several uniform nodes.
  bool canRun(Collective coll, const Situation& s) const override {
    return s.int8 && !s.subgroup && s.g.nodes > 1 && s.g.uniform;
  }
  // The direct exchange: per phase, a message to every other node, posted
  // at once (one start-up, and the software cost of each further message;
  // a later chunk's hide behind an earlier one's bytes); the allreduce's
  // chunks overlap the node's steps and the network's (the slower bounds
  // it, the other adds a chunk's share).
  double estimate(Collective coll, double bytes, const Situation& s,
                  const CostModel& m) const override {
    const Int8Parts p = int8Parts(coll, bytes, s, m);
    const double phases = coll == Collective::ReduceScatter ? 1.0 : 2.0;
    const double chunks =
        static_cast<double>(pipelineChunks(static_cast<size_t>(bytes), s.pipelineChunkBytes));
    const double round = p.interAlpha + (s.g.nodes - 2) * kPerMessageUs * 1e-6;
    return p.intraAlphas + phases * round + std::max(p.intra, p.inter) +
           std::min(p.intra, p.inter) / chunks;
  }
  void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const override {
    std::vector<char> own;  // a lone exchange's Comm (tests) has no book
    const Int8Run run{.scratch = comm.book ? comm.book->quantized : own,
                      .feedback = comm.int8Feedback,
                      .chunkBytes = t.pipelineChunkBytes};
    if (coll == Collective::ReduceScatter) return int8TwoLevelReduceScatter(comm, a, run);
    int8TwoLevelAllreduce(comm, a, run);
  }
  const char* fallback() const override { return "two_level"; }
  bool int8Wire() const override { return true; }
  // Chosen by the int8 rule (choose(), collectives.cpp), never weighed against the rest.
  bool autoCandidate(Collective coll, const Situation& s) const override { return false; }
};

}  // namespace

const Algorithm& twoLevelInt8Algorithm() {
  static const TwoLevelInt8 a;
  return a;
}

}  // namespace smdccl
