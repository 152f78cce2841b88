#pragma once
// What selection would choose for a collective on a group of any shape,
// without the group (smdccl._C.plan, python -m smdccl.tune): the situation
// and wire the backend's dispatch sees for such a group (collectives.h).
#include <map>
#include <string>

#include "algorithms/collectives.h"

namespace smdccl {

struct PlanQuery {
  Collective coll = Collective::Allreduce;
  double bytes = 0;
  GroupShape shape;
  Compression compression;  // what float32 reductions cross nodes as
};

struct Plan {
  std::string chosen;                       // the algorithm that would run
  std::map<std::string, double> estimates;  // every one that can run (forced too): seconds
  std::string model;                        // the model, as the wire scales it
};

// Throws InvalidArgument for an inconsistent shape or a size out of range.
Plan planFor(const PlanQuery& q, const Tuning& t);

}  // namespace smdccl
