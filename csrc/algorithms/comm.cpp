#include "algorithms/comm.h"

#include <algorithm>
#include <stdexcept>

namespace smdccl {

const Hierarchy& levelsOf(const Comm& c) {
  if (!c.levels) throw std::logic_error("two-level algorithm on a Comm without levels");
  return *c.levels;
}

int Comm::ringPosition() const {
  auto it = std::find(ring.begin(), ring.end(), rank());
  if (it == ring.end()) throw std::logic_error("rank missing from ring order");
  return static_cast<int>(it - ring.begin());
}

Comm Comm::sub(const std::vector<int>& groupRanks) const {
  Comm s{mesh, ctx, {}, nullptr, {}, -1, wire, wireIntra, book, int8, int8Feedback};  // levels: the whole group only
  for (int r : groupRanks) s.members.push_back(groupRank(r));
  auto it = std::find(s.members.begin(), s.members.end(), groupRank(rank()));
  if (it == s.members.end()) throw std::logic_error("sub-communicator without this rank");
  s.myIndex = static_cast<int>(it - s.members.begin());
  s.ring.resize(groupRanks.size());
  for (size_t i = 0; i < s.ring.size(); ++i) s.ring[i] = static_cast<int>(i);
  return s;
}

Blocks pickBlocks(const Blocks& b, const std::vector<int>& ranks) {
  Blocks out;
  for (int r : ranks) {
    out.offset.push_back(b.offset[r]);
    out.length.push_back(b.length[r]);
  }
  return out;
}

Wire Comm::wireTo(int peer) const {
  if (wire == Wire::F32 || wireIntra) return wire;
  return mesh.topology().sameNode(groupRank(rank()), groupRank(peer)) ? Wire::F32 : wire;
}

bool Comm::compressesSomeHop(DType dt) const {
  if (dt != DType::F32 || wire == Wire::F32 || size() < 2) return false;
  if (wireIntra) return true;
  const Topology& topo = mesh.topology();
  for (int r = 1; r < size(); ++r)
    if (!topo.sameNode(groupRank(0), groupRank(r))) return true;
  return false;
}

bool Comm::compressesEveryHop(DType dt) const {
  if (!compressesSomeHop(dt)) return false;
  return wireIntra || eachOnItsOwnNode();
}

bool Comm::eachOnItsOwnNode() const {
  if (size() < 2) return false;
  const Topology& topo = mesh.topology();
  for (int a = 0; a < size(); ++a)
    for (int b = a + 1; b < size(); ++b)
      if (topo.sameNode(groupRank(a), groupRank(b))) return false;
  return true;
}

Blocks Blocks::even(size_t count, int parts, size_t elemSize) {
  Blocks b;
  size_t base = count / parts, extra = count % parts, at = 0;
  for (int r = 0; r < parts; ++r) {
    size_t n = base + (static_cast<size_t>(r) < extra ? 1 : 0);
    b.offset.push_back(at * elemSize);
    b.length.push_back(n * elemSize);
    at += n;
  }
  return b;
}

Blocks Blocks::equal(int parts, size_t bytesEach) {
  return fromLengths(std::vector<size_t>(static_cast<size_t>(parts), bytesEach));
}

Blocks Blocks::fromLengths(const std::vector<size_t>& lengths) {
  Blocks b;
  size_t at = 0;
  for (size_t n : lengths) {
    b.offset.push_back(at);
    b.length.push_back(n);
    at += n;
  }
  return b;
}

size_t Blocks::total() const {
  size_t t = 0;
  for (size_t n : length) t += n;
  return t;
}

}  // namespace smdccl
