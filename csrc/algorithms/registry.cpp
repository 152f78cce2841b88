// The registered algorithms. Adding one: its own file defining
// `const Algorithm& <name>Algorithm()`, and one entry here.
#include <cstring>

#include "algorithms/algorithm.h"

#define SMDCCL_ALGORITHMS(X) \
  X(ring)                    \
  X(rd)                      \
  X(halving)                 \
  X(tree)                    \
  X(direct)                  \
  X(chain)                   \
  X(twoLevel)                \
  X(twoLevelRd)              \
  X(twoLevelTree)            \
  X(twoLevelInt8)            \
  X(twoLevelInt8Halving)

namespace smdccl {

#define SMDCCL_DECLARE(n) const Algorithm& n##Algorithm();
SMDCCL_ALGORITHMS(SMDCCL_DECLARE)
#undef SMDCCL_DECLARE

const std::vector<const Algorithm*>& registeredAlgorithms() {
#define SMDCCL_ENTRY(n) &n##Algorithm(),
  static const std::vector<const Algorithm*> all = {SMDCCL_ALGORITHMS(SMDCCL_ENTRY)};
#undef SMDCCL_ENTRY
  return all;
}

const Algorithm* findAlgorithm(const std::string& name) {
  for (const Algorithm* a : registeredAlgorithms())
    if (name == a->name()) return a;
  if (name == "recursive_doubling") return findAlgorithm("rd");  // the long spelling
  return nullptr;
}

std::string algorithmNames() {
  std::string out;
  for (const Algorithm* a : registeredAlgorithms())
    out += (out.empty() ? "" : ", ") + std::string(a->name());
  return out;
}

const char* collectiveName(Collective coll) {
  switch (coll) {
    case Collective::Allreduce: return "allreduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Allgather: return "allgather";
    case Collective::Broadcast: return "broadcast";
    case Collective::Reduce: return "reduce";
  }
  return "?";
}

bool collectiveFromName(const std::string& name, Collective* out) {
  for (int k = 0; k < kCollectives; ++k)
    if (name == collectiveName(static_cast<Collective>(k))) {
      *out = static_cast<Collective>(k);
      return true;
    }
  return false;
}

}  // namespace smdccl
