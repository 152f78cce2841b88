#pragma once
// The view of a group an algorithm runs against: ranks, links, the ring
// order, the running op's context. Algorithms work on raw bytes.
#include <cstddef>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/cost_model.h"
#include "algorithms/exchange.h"
#include "common/op_context.h"
#include "transport/mesh.h"

namespace smdccl {

// Error feedback of the int8 wire, per tensor (a DDP bucket, an FSDP2
// module's gradients): what this rank's quantizations rounded away the
// last time, by element of what the collective reduces, added before they
// quantize the same elements again (1-bit Adam's scheme on both sides):
// `sent`, the pieces this rank quantized for other nodes; `owned`, the sums
// it quantized as their owner. An allreduce's follow the tensor's elements
// (fitted by whoever keeps them); a reduce-scatter keeps `sent` only, for
// the blocks it sends, laid out by the algorithm (two_level_int8.cpp's
// SentResiduals), the same every step. Over k steps what was applied
// equals the true sum up to one step's quantization error.
struct Int8Residuals {
  std::vector<float> sent, owned;
  // Sized to `count` elements (`owned`: none for a reduce-scatter); a new
  // size (a new tensor, or the first step) starts from nothing carried.
  void fit(size_t count, bool withOwned) {
    const size_t owns = withOwned ? count : 0;
    if (sent.size() == count && owned.size() == owns) return;
    sent.assign(count, 0.0f);
    owned.assign(owns, 0.0f);
  }
};

// The residuals of the tensor a collective reduces part of: its element 0
// is the tensor's element `first` (the CUDA paths' step across nodes
// reduces this rank's share of the tensor, a chunk at a time).
struct Int8Feedback {
  Int8Residuals* residuals = nullptr;
  size_t first = 0;
  explicit operator bool() const { return residuals != nullptr; }
  // The same tensor's, for a collective whose element 0 is this one's n.
  Int8Feedback from(size_t n) const { return {residuals, first + n}; }
  float* sent(size_t i) const { return residuals->sent.data() + first + i; }
  float* owned(size_t i) const { return residuals->owned.data() + first + i; }
  // Whether the residuals hold `count` elements from here, both kinds.
  bool covers(size_t count) const {
    return residuals->sent.size() >= first + count && residuals->owned.size() >= first + count;
  }
};

// A Comm is either the whole group or a sub-communicator of some of its
// ranks (one node's ranks, or one rank per node): algorithms see ranks
// 0..size()-1 either way, so each level of a two-level scheme reuses them.
struct Comm {
  Mesh& mesh;
  OpContext ctx;
  std::vector<int> ring;              // ranks of this Comm in ring order (node-major)
  const Hierarchy* levels = nullptr;  // the whole group's nodes, for two-level algorithms
  std::vector<int> members;           // group rank of each rank here; empty: the whole group
  int myIndex = -1;                   // this rank's index in members
  // Float32 reductions of this op may cross node boundaries as 16-bit
  // values (and inside nodes too with wireIntra); see wireTo().
  Wire wire = Wire::F32;
  bool wireIntra = false;
  // The group's per-peer exchange state (op headers); shared by sub-Comms.
  ExchangeBook* book = nullptr;
  // Float32 SUM of this op crosses node boundaries as block int8
  // (compression="int8"): the int8 algorithms run it (two_level_int8.cpp);
  // wire stays F32, so whatever else runs keeps full precision.
  bool int8 = false;
  // The int8 wire's error feedback for this op's tensor (none: empty).
  Int8Feedback int8Feedback{};

  int rank() const { return members.empty() ? mesh.rank() : myIndex; }
  int size() const { return members.empty() ? mesh.size() : static_cast<int>(members.size()); }
  int groupRank(int r) const { return members.empty() ? r : members[r]; }
  Link& link(int peer) { return mesh.link(groupRank(peer), ctx.deadline); }
  Exchange exchange() { return Exchange(ctx, mesh.myBell(), mesh.shmNode(), book); }
  int ringPosition() const;
  // What float32 reduction data to `peer` travels as.
  Wire wireTo(int peer) const;
  // Whether `dt` data reduced over this Comm crosses some hop as 16 bits:
  // a wire is set, dt is float32 and two ranks sit on different nodes (or
  // wireIntra compresses inside nodes too). Decided from the topology, so
  // every rank gets the same answer.
  bool compressesSomeHop(DType dt) const;
  // ... and every hop of it does (wireIntra, or no two ranks share a node).
  bool compressesEveryHop(DType dt) const;
  // No two of its ranks share a node (and it has two).
  bool eachOnItsOwnNode() const;
  // Whether a dt reduction with op over it runs the int8 wire by
  // int8Across*: an int8 op's float32 SUM, each rank on a node of its own.
  bool int8Across(DType dt, RedOp op) const {
    return int8 && dt == DType::F32 && op == RedOp::Sum && eachOnItsOwnNode();
  }
  // What a schedule over this Comm rounds its final results to: the wire
  // where some hop is compressed (a rank that received a value over such a
  // hop holds it at the wire's precision, so the rank that computed it must
  // too, or the ranks' bits differ); F32, nothing rounded, where none is.
  Wire resultWire(DType dt) const { return compressesSomeHop(dt) ? wire : Wire::F32; }
  // The Comm of the given group ranks (this rank among them), ring in that order.
  Comm sub(const std::vector<int>& groupRanks) const;
};

// c.levels, for a two-level algorithm (throws logic_error without them).
const Hierarchy& levelsOf(const Comm& c);

// Byte ranges of a buffer, one per group rank.
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> length;
  // `count` elements split as evenly as possible over `parts` ranks.
  static Blocks even(size_t count, int parts, size_t elemSize);
  // Consecutive blocks of the given byte lengths.
  static Blocks fromLengths(const std::vector<size_t>& lengths);
  // `parts` consecutive blocks of `bytesEach` bytes.
  static Blocks equal(int parts, size_t bytesEach);
  size_t total() const;
};
// The blocks of `b` of the given ranks, re-indexed 0..n-1.
Blocks pickBlocks(const Blocks& b, const std::vector<int>& ranks);

// ---- allreduce family (ring.cpp, recursive_doubling.cpp) ----
// A reduce-scatter and/or an allgather over blocks of buf (one per rank of
// the Comm), as appendRing and appendHalving append them.
struct RsAgPhases {
  char* buf = nullptr;
  const Blocks* blocks = nullptr;
  // Out of place (reduce-scatter only; supportsOutOfPlace() schedules): the
  // blocks are read from `in`, which is left as it was; buf takes the
  // partial sums, this rank's finished block goes to `mine`.
  const char* in = nullptr;
  char* mine = nullptr;
  DType dt = DType::U8;
  RedOp op = RedOp::Sum;
  bool reduceScatter = true;
  bool allgather = true;
  // An index in the exchange that must finish before anything is sent from
  // or reduced into buf (-1: none).
  int startAfter = -1;
  // Round the reduce-scatter's last sums to c.resultWire(): they are final
  // results, and every rank must hold the same bits.
  bool finalReduce = true;
};
// Appends a ring reduce-scatter and/or allgather over c's ranks to `ex`
// without running it, so that several rings (levels, chunks) stream in one
// exchange. Returns the index of its last receive (-1 when there is none).
// Float32 data crosses each hop as c.wireTo() says.
int appendRing(Exchange& ex, Comm& c, const RsAgPhases& a);
// The data block a ring's step handles as logical block `logical` (ring
// position i reduces logical block i-s-1 at reduce-scatter step s and ends
// owning its own rank's block): one mapping for every ring schedule.
int ringDataBlock(const Comm& c, int logical);
// On return block r of a.buf (a.blocks) holds the reduction of every rank's
// block r, on rank r; out of place (a.in, a.out), a.out does.
void ringReduceScatter(Comm& c, const CollectiveArgs& a);
// On entry block rank() of buf holds this rank's data; on return all blocks are filled.
void ringAllgather(Comm& c, char* buf, const Blocks& b);
void ringAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op);
// A ring reduce-scatter, then every block to the root (a: buf, count, dt, op, root).
void ringReduce(Comm& c, const CollectiveArgs& a);
// appendRing's and appendHalving's signature.
using AppendReduceScatter = int (*)(Exchange&, Comm&, const RsAgPhases&);
void recursiveDoublingAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op);

// ---- recursive halving / doubling, Rabenseifner (halving.cpp) ----
// Whether c's reduce-scatter phases run as halving rather than as a ring:
// every hop of c carries a 16-bit wire and c.size() > 2. Pairwise partial
// sums round less, and smaller values, than a ring's chain.
bool prefersHalving(const Comm& c, DType dt);
// appendRing's contract for any group size: a group that is not a power of
// two first folds the first 2*(p - 2^k) ranks pairwise (the even one hands
// its data to the odd one) and hands the results back at the end.
int appendHalving(Exchange& ex, Comm& c, const RsAgPhases& a);
// appendHalving where prefersHalving(c, a.dt) and a reduction is asked for, else appendRing.
int appendReduceScatterAllgather(Exchange& ex, Comm& c, const RsAgPhases& a);

// ---- the int8 wire (two_level_int8.cpp) ----
// What one int8 allreduce needs besides its arguments.
struct Int8Run {
  std::vector<char>& scratch;  // the quantized pieces (kept by the caller between ops)
  Int8Feedback feedback{};     // fitted to the tensor by whoever keeps it
  size_t chunkBytes = 4 << 20;  // pipeline chunks (SMDCCL_PIPELINE_CHUNK_KB)
};
// In place on a.buf (a.count float32, SUM) over uniform nodes.
void int8TwoLevelAllreduce(Comm& c, const CollectiveArgs& a, const Int8Run& run);
// The int8 allreduce inside a node of `local` ranks (2 alphas per other
// rank; a float32 reduce-scatter and allgather), and across `nodes` nodes
// without the alphas (the quantized bytes through the uplink, quantizing
// and decoding): both int8 allreduces have these parts, in sequence or
// overlapped.
struct Int8Parts {
  double intraAlphas = 0, intra = 0, interAlpha = 0, inter = 0;
};
Int8Parts int8Parts(Collective coll, double bytes, const Situation& s, const CostModel& m);
// Unpipelined, for small tensors over many nodes: the node's float32
// reduce-scatter, then across nodes recursive halving (log2(nodes)
// exchanges, each sending its half's pieces quantized and adding the
// partner's decoded), the owner's piece quantized once and recursive
// doubling of the quantized pieces, then the node's allgather. A power of
// two of uniform nodes.
void int8HalvingAllreduce(Comm& c, const CollectiveArgs& a, std::vector<char>& scratch);
// The same over a Comm whose ranks are each on a node of its own (the step
// across nodes of the CUDA paths, staged on the host): no node steps.
void int8AcrossAllreduce(Comm& c, const CollectiveArgs& a, const Int8Run& run);
void int8AcrossReduceScatter(Comm& c, const CollectiveArgs& a, const Int8Run& run);
// A round of those staged with int8 packed on the device: piece j of the
// slot (counts[j] values at offsets[j]) holds, for every other rank, its
// values quantized (int8Bytes), for this rank its float32 values.
struct Int8Slot {
  std::vector<size_t> counts, offsets;
};
// On return every piece holds its owner's quantized sum: what
// int8AcrossAllreduce gives one pipeline chunk, bit for bit.
void int8AcrossPackedAllreduce(Comm& c, char* slot, const Int8Slot& s, std::vector<char>& scratch);
// On return this rank's piece holds its float32 sum: int8AcrossReduceScatter's bits.
void int8AcrossPackedReduceScatter(Comm& c, char* slot, const Int8Slot& s,
                                   std::vector<char>& scratch);
// In place on a.buf (*a.blocks of float32, SUM) over uniform nodes: block
// rank() ends reduced, the other nodes' contributions quantized once (with
// run.feedback: the sender's residuals, by element of a.buf); pipelined in
// chunks of about run.chunkBytes (a piece of every block each).
void int8TwoLevelReduceScatter(Comm& c, const CollectiveArgs& a, const Int8Run& run);
// Pipelined: the buffer is cut into chunks of about chunkBytes, each halved
// and doubled, all streaming in one exchange.
void halvingAllreduce(Comm& c, const CollectiveArgs& a, size_t chunkBytes);
void halvingReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op);

// ---- trees (tree.cpp) ----
// Double binary tree allreduce appended to `ex`: two complementary binary
// trees over c's ranks each reduce and broadcast half of [a.buf, a.buf +
// a.count) (a.dt, a.op), cut into `chunks` pieces that stream up and down at once.
// `startAfter` must finish before anything touches buf. Returns an index
// that finishes when this rank's result is complete.
int appendDoubleTree(Exchange& ex, Comm& c, const CollectiveArgs& a, size_t chunks,
                     int startAfter = -1);
// The parent and children (-1: none) of rank r in the in-order binary tree
// over 0..p-1 (tree 0), or in its shifted complement (tree 1), where most
// of tree 0's leaves are interior. Pure: unit-tested.
struct TreeLinks {
  int parent = -1, child0 = -1, child1 = -1;
};
TreeLinks binaryTreeLinks(int r, int p, int tree);
void treeBroadcast(Comm& c, char* buf, size_t bytes, int root);
// Binomial tree reduce: on return root's buf holds the reduction.
void treeReduce(Comm& c, const CollectiveArgs& a);
// Chunks the double tree cuts `bytes` into: the minimum of the pipeline's
// estimate (fill and drain of 2*depth steps against per-chunk latency).
size_t doubleTreeChunks(double bytes, int p, const LevelCost& link);
double doubleTreeSeconds(double bytes, int p, const LevelCost& link, double reduceGbps);

// ---- two levels: intra-node shared memory, inter-node links (two_level*.cpp) ----
// c must be the whole group (c.levels set). How the pipelined two-level
// allreduce reduces each shard across nodes.
enum class AcrossNodes { Ring, DoubleTree };
struct TwoLevelPipeline {
  size_t chunkBytes = 4 << 20;  // the message is cut into chunks of about this size
  AcrossNodes across = AcrossNodes::Ring;
  const LevelCost* interLink = nullptr;  // DoubleTree: sizes its chunks (nullptr: one chunk)
};
// a: buf, count, dt, op.
void twoLevelAllreduce(Comm& c, const CollectiveArgs& a, const TwoLevelPipeline& pipeline);
void twoLevelRdAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op);
// Uniform nodes only (every node the same number of ranks).
void twoLevelReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op);
void twoLevelAllgather(Comm& c, char* buf, const Blocks& b);
void twoLevelBroadcast(Comm& c, char* buf, size_t bytes, int root);

// ---- one-to-all, all-to-one, all-to-all (chain.cpp, direct.cpp) ----
void chainBroadcast(Comm& c, char* buf, size_t bytes, int root);
// Every rank sends its block to every other rank in one round.
void directAllgather(Comm& c, char* buf, const Blocks& b);
// Every block straight to its owner, who sums the p-1 contributions into
// its own in one chained pass (a.blocks, a.buf; out of place a.in, a.out,
// as ringReduceScatter).
void directReduceScatter(Comm& c, const CollectiveArgs& a);
// sendBlocks index the input by destination, recvBlocks the output by source.
void directAlltoall(Comm& c, const char* in, const Blocks& sendBlocks, char* out,
                    const Blocks& recvBlocks);
// A gather or scatter between the root's blocks and every rank's own
// `bytes`: gather sends `in` and the root receives into `out` as *blocks;
// scatter sends the root's `in` as *blocks and every rank receives `out`.
// `blocks` is read on the root only (nullptr elsewhere).
struct RootBlocks {
  const char* in = nullptr;
  char* out = nullptr;
  size_t bytes = 0;
  const Blocks* blocks = nullptr;
  int root = 0;
};
// Root receives block r of `out` from rank r (its own block is copied by the caller).
void directGather(Comm& c, const RootBlocks& g);
// Seconds for appendGather of `bytes` in all (the model's term; direct.cpp).
double gatherSeconds(double bytes, const Costs& k);
// In place: block r of a.buf (*a.blocks) goes from rank r to a.root,
// after `startAfter`.
void appendGather(Exchange& ex, Comm& c, const CollectiveArgs& a, int startAfter);
// Reduce as `reduceScatter` (appendRing, appendHalving) over even blocks,
// then a gather of every block to root: on return root's buf (a.buf,
// a.count elements of a.dt) holds the reduction.
void reduceScatterThenGather(Comm& c, const CollectiveArgs& a, AppendReduceScatter reduceScatter);
// Rank r receives block r of the root's `in` into `out`.
void directScatter(Comm& c, const RootBlocks& s);

}  // namespace smdccl
