#include "check.h"
#include "common/error.h"
#include "topology/topology.h"

using namespace smdccl;

TEST(topology_spec_parsing) {
  CHECK((parseTopologySpec("2x2") == std::vector<int>{2, 2}));
  CHECK((parseTopologySpec("3,1") == std::vector<int>{3, 1}));
  CHECK((parseTopologySpec("1x4") == std::vector<int>{4}));
  CHECK((parseTopologySpec("4x1") == std::vector<int>{1, 1, 1, 1}));
  CHECK(parseTopologySpec("").empty());
  CHECK_THROWS(parseTopologySpec("2x"), InvalidArgument);
  CHECK_THROWS(parseTopologySpec("a,b"), InvalidArgument);
  CHECK_THROWS(parseTopologySpec("0x2"), InvalidArgument);
  CHECK_THROWS(parseTopologySpec("3,,1"), InvalidArgument);
}

TEST(topology_from_host_keys) {
  Topology t = topologyFromHostKeys({"a", "b", "a", "b"});
  CHECK(t.numNodes == 2);
  CHECK((t.nodeOf == std::vector<int>{0, 1, 0, 1}));
  CHECK((t.localRanks(1) == std::vector<int>{1, 3}));
  // The ring visits each node's ranks consecutively.
  CHECK((t.ringOrder() == std::vector<int>{0, 2, 1, 3}));
  CHECK(t.describe() == "2 nodes: [0,2] [1,3]");
}

TEST(topology_from_spec) {
  Topology t = topologyFromSpec({3, 1}, {0, 1, 2, 3}, true);
  CHECK((t.nodeOf == std::vector<int>{0, 0, 0, 1}));
  // A subgroup takes the nodes of its members' global ranks.
  Topology sub = topologyFromSpec({2, 2}, {3, 0}, false);
  CHECK(sub.numNodes == 2 && !sub.sameNode(0, 1));
  CHECK_THROWS(topologyFromSpec({2, 2}, {0, 1, 2}, true), InvalidArgument);
  CHECK_THROWS(topologyFromSpec({2, 2}, {0, 4}, false), InvalidArgument);
}

TEST(hierarchy_levels) {
  Topology t = topologyFromHostKeys({"a", "b", "a", "b"});
  Hierarchy h = hierarchyOf(t, 3);
  CHECK(h.numNodes() == 2 && h.myNode == 1 && h.myLocal == 1);
  CHECK((h.nodes[0] == std::vector<int>{0, 2}));
  CHECK(h.uniform() && h.maxLocal() == 2 && h.localSize() == 2);
  CHECK((h.acrossNodes(0) == std::vector<int>{0, 1}));
  CHECK(h.shape() == "2 nodes x 2 ranks");
  Hierarchy u = hierarchyOf(topologyFromSpec({3, 1}, {0, 1, 2, 3}, true), 3);
  CHECK(!u.uniform() && u.maxLocal() == 3 && u.localSize() == 1 && u.myLocal == 0);
  CHECK(u.shape() == "uneven nodes 3,1");
}

TEST(hierarchy_place_of_a_rank) {
  Hierarchy h = hierarchyOf(topologyFromHostKeys({"a", "b", "a", "b", "b"}), 4);
  CHECK(h.myNode == 1 && h.myLocal == 2);  // nodes [0,2] [1,3,4]
  CHECK(h.placeOf(2).node == 0 && h.placeOf(2).local == 1);
  CHECK(h.placeOf(3).node == 1 && h.placeOf(3).local == 1);
  CHECK(h.placeOf(7).node == -1 && h.placeOf(7).local == -1);
}
