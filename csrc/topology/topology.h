#pragma once
// Who shares a host with whom. Pure functions of their inputs: unit-testable
// without processes.
#include <string>
#include <vector>

namespace smdccl {

struct Topology {
  // nodeOf[r]: dense node index (0..numNodes-1, in order of first appearance)
  // of group rank r.
  std::vector<int> nodeOf;
  int numNodes = 0;

  bool sameNode(int a, int b) const { return nodeOf[a] == nodeOf[b]; }
  // Group ranks on the node of `rank`, ascending.
  std::vector<int> localRanks(int rank) const;
  // A ring through all ranks that visits each node's ranks consecutively, so
  // a flat ring crosses each node boundary once per direction.
  std::vector<int> ringOrder() const;
  // "2 nodes: [0,1] [2,3]" for logs and errors.
  std::string describe() const;
};

// The two levels as one rank sees them: which ranks share each node, and
// where this rank sits. Two-level algorithms run their intra-node phase on
// nodes[myNode] and their inter-node phase on one rank per node.
struct Hierarchy {
  std::vector<std::vector<int>> nodes;  // group ranks of each node, ascending
  int myNode = 0;
  int myLocal = 0;  // index of this rank in nodes[myNode]

  int numNodes() const { return static_cast<int>(nodes.size()); }
  int localSize() const { return static_cast<int>(nodes[myNode].size()); }
  int maxLocal() const;
  // Every node holds the same number of ranks.
  bool uniform() const;
  // The rank with local index `local` on each node, by node (uniform only).
  std::vector<int> acrossNodes(int local) const;
  // Where group rank `rank` sits: its node and its index there ({-1, -1}: nowhere).
  struct Place {
    int node = -1, local = -1;
  };
  Place placeOf(int rank) const;
  // "2 nodes x 2 ranks" or "uneven nodes 3,1", for logs.
  std::string shape() const;
};

Hierarchy hierarchyOf(const Topology& t, int rank);

// Node sizes from SMDCCL_TOPOLOGY: "2x2" -> {2,2}; "3,1" -> {3,1}; "" -> {}.
// Throws InvalidArgument with the accepted forms on anything else.
std::vector<int> parseTopologySpec(const std::string& spec);

// Topology from each rank's host key (hostname + boot id).
Topology topologyFromHostKeys(const std::vector<std::string>& hostKeys);

// Topology from a node-size spec applied to global ranks (nodes are
// consecutive blocks of global ranks). `isWholeWorld` asks that the spec
// covers exactly the group (true for the default group).
Topology topologyFromSpec(const std::vector<int>& nodeSizes, const std::vector<int>& globalRanks,
                          bool isWholeWorld);

}  // namespace smdccl
