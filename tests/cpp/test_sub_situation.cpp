// What selection knows of a sub-communicator (Comm::sub): the nodes its
// ranks are on. The CUDA paths' step across nodes (a rank per node) is
// costed on the network it crosses, as a group of one-rank nodes is, not
// as one node; and no two-level algorithm, which needs the group's levels,
// runs on any sub-communicator.
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "check.h"
#include "memory_fabric.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

namespace {

struct Seen {
  GroupShape across, local, mixed;
  bool subgroups = true, twoLevelRuns = false;
  std::vector<std::string> acrossChoices;
  float acrossSum = 0, localSum = 0;
};

bool sameShape(const GroupShape& a, const GroupShape& b) {
  return a.ranks == b.ranks && a.nodes == b.nodes && a.maxLocal == b.maxLocal &&
         a.uniform == b.uniform;
}

const std::vector<size_t> kSizes = {4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20};
const Collective kColls[] = {Collective::Allreduce, Collective::ReduceScatter,
                             Collective::Allgather, Collective::Broadcast};

std::vector<std::string> choicesFor(const Situation& s) {
  std::vector<std::string> names;
  for (Collective coll : kColls)
    for (size_t bytes : kSizes) names.push_back(choose(coll, bytes, s, Tuning{}).algo->name());
  return names;
}

}  // namespace

TEST(sub_comms_are_shaped_by_the_nodes_of_their_ranks) {
  MemoryFabric fabric(std::vector<int>{2, 2, 2, 2});  // 4 nodes of 2
  std::vector<Seen> seen(8);
  const std::string error = fabric.run([&](int r, Comm& c) {
    const Hierarchy& h = *c.levels;
    Seen& me = seen[static_cast<size_t>(r)];
    Comm across = c.sub(h.acrossNodes(h.myLocal));
    Comm local = c.sub(h.nodes[h.myNode]);
    const Situation sa = situationOf(across, DType::F32, Tuning{});
    const Situation sl = situationOf(local, DType::F32, Tuning{});
    me.across = sa.g;
    me.local = sl.g;
    me.subgroups = sa.subgroup && sl.subgroup;
    me.acrossChoices = choicesFor(sa);
    // Ranks 0, 1 (node 0) and 2 (node 1): a sub-communicator across uneven nodes.
    if (r <= 2) me.mixed = situationOf(c.sub({0, 1, 2}), DType::F32, Tuning{}).g;
    for (const Situation* s : {&sa, &sl})
      for (const Algorithm* a : registeredAlgorithms())
        for (Collective coll : kColls)
          if (std::strncmp(a->name(), "two_level", 9) == 0 && a->serves(coll) &&
              a->canRun(coll, *s))
            me.twoLevelRuns = true;
    // What the model picks runs: integers, exact in float32.
    float x = static_cast<float>(r + 1), y = x;
    allreduce(across, {.buf = reinterpret_cast<char*>(&x), .count = 1, .dt = DType::F32}, Tuning{});
    allreduce(local, {.buf = reinterpret_cast<char*>(&y), .count = 1, .dt = DType::F32}, Tuning{});
    me.acrossSum = x;
    me.localSum = y;
  });
  CHECK(error.empty());
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  // A group of 4 one-rank nodes, as the whole-group model shapes it.
  Situation fourHosts;
  fourHosts.g = GroupShape{.ranks = 4, .nodes = 4, .maxLocal = 1, .uniform = true};
  Situation oneNode = fourHosts;  // what a sub-communicator was modelled as before
  oneNode.g = GroupShape{.ranks = 4, .nodes = 1, .maxLocal = 4, .uniform = true};
  oneNode.subgroup = true;
  const std::vector<std::string> hosts = choicesFor(fourHosts);
  CHECK(hosts != choicesFor(oneNode));  // the shape changes some choice
  for (int r = 0; r < 8; ++r) {
    const Seen& s = seen[static_cast<size_t>(r)];
    CHECK(sameShape(s.across, GroupShape{.ranks = 4, .nodes = 4, .maxLocal = 1, .uniform = true}));
    CHECK(sameShape(s.local, GroupShape{.ranks = 2, .nodes = 1, .maxLocal = 2, .uniform = true}));
    if (r <= 2)
      CHECK(
          sameShape(s.mixed, GroupShape{.ranks = 3, .nodes = 2, .maxLocal = 2, .uniform = false}));
    CHECK(s.subgroups);
    CHECK(!s.twoLevelRuns);
    CHECK(s.acrossChoices == hosts);
    // Ranks of local index l across the nodes: l+1, l+3, l+5, l+7.
    CHECK(s.acrossSum == static_cast<float>(4 * (r % 2) + 16));
    CHECK(s.localSum == static_cast<float>(4 * (r / 2) + 3));
  }
}
