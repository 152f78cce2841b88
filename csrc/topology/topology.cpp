#include "topology/topology.h"

#include <cstdint>
#include <algorithm>
#include <map>
#include <numeric>
#include <string>

#include "common/error.h"

namespace smdccl {

std::vector<int> Topology::localRanks(int rank) const {
  std::vector<int> out;
  for (int r = 0; r < static_cast<int>(nodeOf.size()); ++r)
    if (nodeOf[r] == nodeOf[rank]) out.push_back(r);
  return out;
}

std::vector<int> Topology::ringOrder() const {
  std::vector<int> order(nodeOf.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return nodeOf[a] < nodeOf[b]; });
  return order;
}

std::string Topology::describe() const {
  std::string s = std::to_string(numNodes) + (numNodes == 1 ? " node:" : " nodes:");
  for (int n = 0; n < numNodes; ++n) {
    s += " [";
    bool first = true;
    for (int r = 0; r < static_cast<int>(nodeOf.size()); ++r) {
      if (nodeOf[r] != n) continue;
      s += (first ? "" : ",") + std::to_string(r);
      first = false;
    }
    s += "]";
  }
  return s;
}

int Hierarchy::maxLocal() const {
  size_t m = 0;
  for (const auto& n : nodes) m = std::max(m, n.size());
  return static_cast<int>(m);
}

bool Hierarchy::uniform() const {
  for (const auto& n : nodes)
    if (n.size() != nodes[0].size()) return false;
  return true;
}

Hierarchy::Place Hierarchy::placeOf(int rank) const {
  for (size_t n = 0; n < nodes.size(); ++n) {
    auto it = std::find(nodes[n].begin(), nodes[n].end(), rank);
    if (it != nodes[n].end()) return {static_cast<int>(n), static_cast<int>(it - nodes[n].begin())};
  }
  return {};
}

std::vector<int> Hierarchy::acrossNodes(int local) const {
  std::vector<int> out;
  for (const auto& n : nodes) out.push_back(n[local]);
  return out;
}

std::string Hierarchy::shape() const {
  if (uniform())
    return std::to_string(numNodes()) + (numNodes() == 1 ? " node x " : " nodes x ") +
           std::to_string(nodes[0].size()) + (nodes[0].size() == 1 ? " rank" : " ranks");
  std::string s = "uneven nodes ";
  for (size_t i = 0; i < nodes.size(); ++i) s += (i ? "," : "") + std::to_string(nodes[i].size());
  return s;
}

Hierarchy hierarchyOf(const Topology& t, int rank) {
  Hierarchy h;
  h.nodes.resize(t.numNodes);
  for (int r = 0; r < static_cast<int>(t.nodeOf.size()); ++r) h.nodes[t.nodeOf[r]].push_back(r);
  const Hierarchy::Place mine = h.placeOf(rank);
  h.myNode = mine.node;
  h.myLocal = mine.local;
  return h;
}

static int parsePositive(const std::string& tok, const std::string& spec) {
  SMDCCL_CHECK_ARG(!tok.empty() && tok.find_first_not_of("0123456789") == std::string::npos,
                   "SMDCCL_TOPOLOGY='", spec,
                   "' is not understood: use NODESxRANKS (e.g. 2x2) or comma-separated ranks "
                   "per node (e.g. 3,1)");
  // Digits only (checked above): a count beyond 2^20 is a typo, not a machine.
  SMDCCL_CHECK_ARG(tok.size() <= 7 && std::stol(tok) > 0 && std::stol(tok) <= (1 << 20),
                   "SMDCCL_TOPOLOGY='", spec, "': node and rank counts must be from 1 to ",
                   1 << 20);
  return static_cast<int>(std::stol(tok));
}

std::vector<int> parseTopologySpec(const std::string& spec) {
  if (spec.empty()) return {};
  auto x = spec.find('x');
  if (x != std::string::npos) {
    int nodes = parsePositive(spec.substr(0, x), spec);
    int per = parsePositive(spec.substr(x + 1), spec);
    return std::vector<int>(nodes, per);
  }
  std::vector<int> sizes;
  size_t start = 0;
  while (true) {
    auto comma = spec.find(',', start);
    sizes.push_back(parsePositive(spec.substr(start, comma - start), spec));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return sizes;
}

Topology topologyFromHostKeys(const std::vector<std::string>& hostKeys) {
  Topology t;
  std::map<std::string, int> ids;
  for (const auto& k : hostKeys) {
    auto it = ids.find(k);
    if (it == ids.end()) it = ids.emplace(k, static_cast<int>(ids.size())).first;
    t.nodeOf.push_back(it->second);
  }
  t.numNodes = static_cast<int>(ids.size());
  return t;
}

Topology topologyFromSpec(const std::vector<int>& nodeSizes, const std::vector<int>& globalRanks,
                          bool isWholeWorld) {
  int64_t sum = std::accumulate(nodeSizes.begin(), nodeSizes.end(), int64_t{0});
  SMDCCL_CHECK_ARG(sum <= (1 << 24), "SMDCCL_TOPOLOGY describes ", sum,
                   " ranks: more than any world");
  int total = static_cast<int>(sum);
  if (isWholeWorld)
    SMDCCL_CHECK_ARG(total == static_cast<int>(globalRanks.size()), "SMDCCL_TOPOLOGY describes ",
                     total, " ranks but the world has ", globalRanks.size());
  std::vector<std::string> keys;
  for (int g : globalRanks) {
    SMDCCL_CHECK_ARG(g >= 0 && g < total, "SMDCCL_TOPOLOGY describes ", total,
                     " ranks but global rank ", g, " is in this group");
    int node = 0, end = nodeSizes[0];
    while (g >= end) end += nodeSizes[++node];
    keys.push_back("virtual-node-" + std::to_string(node));
  }
  return topologyFromHostKeys(keys);
}

}  // namespace smdccl
