// The two-level reduce-scatter, allgather and broadcast schedules
// (algorithms/node_then_across.h) that the CUDA paths run with NCCL inside
// the node, here with the host collectives inside the node and, across
// nodes, the very staged rounds the CUDA paths run, on the host stand-in
// device: the results equal the one-level host collectives' on nodes of
// consecutive ranks and on nodes whose ranks are interleaved (where the
// blocks are moved to node-major order and back); and the block moves
// (topology/node_major.h) are as few as the numbering allows.
#include <cstring>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/node_then_across.h"
#include "algorithms/staged_collectives.h"
#include "algorithms/staged_rounds.h"
#include "check.h"
#include "host_stage_device.h"
#include "memory_fabric.h"
#include "topology/node_major.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

namespace {

const Tuning kTuning{};

// NCCL's part played by the host collectives over the node's ranks; the
// staged part by the staged rounds on the host stand-in device.
class HostSteps final : public NodeThenAcrossSteps {
 public:
  explicit HostSteps(Comm& c) : node_(c.sub(levelsOf(c).nodes[levelsOf(c).myNode])) {}
  char* scratch(size_t bytes) override {
    scratch_.assign(bytes, '\x5a');  // not zero: a block left unwritten shows
    return scratch_.data();
  }
  void copy(char* dst, const char* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    ++copies_;
  }
  void nodeReduceScatter(const BlockReduction& r) override {
    const size_t bytes = r.each * elementSize(r.dt);
    Blocks blocks = Blocks::equal(node_.size(), bytes);
    std::vector<char> work(bytes * static_cast<size_t>(node_.size()));
    reduceScatter(
        node_,
        {.buf = work.data(), .dt = r.dt, .op = r.op, .blocks = &blocks, .in = r.in, .out = r.out},
        kTuning);
  }
  void nodeAllgather(const BlockGather& b) override {
    std::memmove(b.out + static_cast<size_t>(node_.rank()) * b.eachBytes, b.in, b.eachBytes);
    allgather(node_, b.out, Blocks::equal(node_.size(), b.eachBytes), kTuning);
  }
  void nodeBroadcast(const CollectiveArgs& a) override {
    broadcast(node_, a.buf, a.bytes, a.root, kTuning);
  }
  void acrossReduceScatter(Comm& across, const BlockReduction& r) override {
    staged(across, reduceScatterRounds(across, r, kTuning));
  }
  void acrossAllgather(Comm& across, const BlockGather& b) override {
    staged(across, allgatherRounds(across, b, 4096, kTuning));
  }
  void acrossBroadcast(Comm& across, const CollectiveArgs& a) override {
    staged(across, broadcastRounds(
                       across, {.buf = a.buf, .bytes = a.bytes, .root = a.root, .roundBytes = 4096},
                       kTuning));
  }
  int copies() const { return copies_; }

 private:
  void staged(Comm& across, StagedRoundsJob job) {
    HostStageDevice device(HostStageDevice::Mode::Deferred);
    std::vector<char> host(job.hostBytes());
    runStagedRounds(across.ctx, device, std::move(job), host.data());
  }

  Comm node_;
  std::vector<char> scratch_;
  int copies_ = 0;
};

std::vector<float> valuesOf(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(
               static_cast<int>((i * 7919 + static_cast<size_t>(r) * 104729) % 2001) - 1000) /
           16.0f;
  return v;
}

char* bytes(std::vector<float>& v) { return reinterpret_cast<char*>(v.data()); }

// Every rank: the two-level collectives against the one-level host ones.
void checkAgainstOneLevel(int r, Comm& c) {
  const int p = c.size();
  for (size_t each : {size_t{1}, size_t{257}, size_t{3000}}) {
    std::vector<float> in = valuesOf(r, each * p), kept = in, ref = in, out(each, -1.0f);
    Blocks blocks = Blocks::equal(p, each * 4);
    reduceScatter(c, {.buf = bytes(ref), .dt = DType::F32, .op = RedOp::Sum, .blocks = &blocks},
                  kTuning);
    HostSteps rs(c);
    nodeThenAcrossReduceScatter(
        c, rs,
        {.in = bytes(in), .out = bytes(out), .each = each, .dt = DType::F32, .op = RedOp::Sum});
    if (std::memcmp(out.data(), ref.data() + each * r, each * 4) != 0)
      throw std::runtime_error("reduce-scatter differs from the host's, each " +
                               std::to_string(each));
    if (in != kept) throw std::runtime_error("reduce-scatter changed its input");

    std::vector<float> want;
    for (int q = 0; q < p; ++q) {
      std::vector<float> b = valuesOf(q + 50, each);
      want.insert(want.end(), b.begin(), b.end());
    }
    for (bool inPlace : {false, true}) {
      std::vector<float> mine = valuesOf(r + 50, each), all(each * p, -1.0f);
      if (inPlace) std::copy(mine.begin(), mine.end(), all.begin() + each * r);
      HostSteps ag(c);
      acrossThenNodeAllgather(c, ag,
                              {.in = inPlace ? bytes(all) + each * 4 * r : bytes(mine),
                               .out = bytes(all),
                               .eachBytes = each * 4});
      if (all != want) throw std::runtime_error("allgather differs, each " + std::to_string(each));
    }
    for (int root = 0; root < p; ++root) {
      std::vector<float> buf = valuesOf(r == root ? 99 : r, each);
      HostSteps bc(c);
      acrossThenNodeBroadcast(c, bc, {.buf = bytes(buf), .bytes = each * 4, .root = root});
      if (buf != valuesOf(99, each))
        throw std::runtime_error("broadcast from " + std::to_string(root) + " differs");
    }
  }
}

Topology interleaved(std::vector<int> nodeOf, int nodes) {
  Topology t;
  t.nodeOf = std::move(nodeOf);
  t.numNodes = nodes;
  return t;
}

}  // namespace

TEST(node_major_runs_move_only_what_the_numbering_needs) {
  Hierarchy consecutive = hierarchyOf(topologyFromSpec({2, 2}, {0, 1, 2, 3}, true), 0);
  CHECK(rankOrderIsNodeMajor(consecutive));
  CHECK((nodeMajorRuns(consecutive) == std::vector<BlockRun>{{0, 0, 4}}));
  // Nodes [0,2] [1,3]: every block moves on its own.
  Hierarchy alternate = hierarchyOf(interleaved({0, 1, 0, 1}, 2), 1);
  CHECK(!rankOrderIsNodeMajor(alternate));
  CHECK((nodeMajorRuns(alternate) ==
         std::vector<BlockRun>{{0, 0, 1}, {2, 1, 1}, {1, 2, 1}, {3, 3, 1}}));
  // Nodes [0,1,4,5] [2,3]: consecutive ranks move together.
  Hierarchy pairs = hierarchyOf(interleaved({0, 0, 1, 1, 0, 0}, 2), 0);
  CHECK((nodeMajorRuns(pairs) == std::vector<BlockRun>{{0, 0, 2}, {4, 2, 2}, {2, 4, 2}}));
  // One node, or one rank per node: nothing moves.
  CHECK(rankOrderIsNodeMajor(hierarchyOf(topologyFromSpec({1, 1, 1}, {0, 1, 2}, true), 2)));
}

TEST(node_then_across_equals_the_one_level_collectives) {
  std::vector<std::string> errors;
  for (int layout = 0; layout < 4; ++layout) {
    MemoryFabric fabric = layout == 0   ? MemoryFabric(std::vector<int>{2, 2})
                          : layout == 1 ? MemoryFabric(std::vector<int>{3, 3})
                          : layout == 2 ? MemoryFabric(interleaved({0, 1, 0, 1}, 2))
                                        : MemoryFabric(interleaved({0, 1, 2, 2, 1, 0}, 3));
    const std::string error = fabric.run(checkAgainstOneLevel);
    if (!error.empty()) errors.push_back("layout " + std::to_string(layout) + ": " + error);
  }
  for (const std::string& e : errors) std::fprintf(stderr, "  FAIL %s\n", e.c_str());
  CHECK(errors.empty());
}

TEST(node_then_across_moves_blocks_only_for_interleaved_nodes) {
  for (bool consecutive : {true, false}) {
    MemoryFabric fabric = consecutive ? MemoryFabric(std::vector<int>{2, 2})
                                      : MemoryFabric(interleaved({0, 1, 0, 1}, 2));
    std::vector<int> copies(4, -1);
    const std::string error = fabric.run([&](int r, Comm& c) {
      std::vector<float> in = valuesOf(r, 40), out(10);
      HostSteps s(c);
      nodeThenAcrossReduceScatter(
          c, s,
          {.in = bytes(in), .out = bytes(out), .each = 10, .dt = DType::F32, .op = RedOp::Sum});
      copies[static_cast<size_t>(r)] = s.copies();
    });
    CHECK(error.empty());
    for (int n : copies) CHECK(n == (consecutive ? 0 : 4));
  }
}
