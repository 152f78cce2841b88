#pragma once
// Which algorithm runs for a collective of a given size on a given group:
// the cheapest estimate (measured profile from SMDCCL_TUNE_FILE, or built-in
// defaults) among the registered algorithms that can run, unless
// SMDCCL_ALGO forces one.
#include <array>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/cost_model.h"

namespace smdccl {

struct Tuning {
  // SMDCCL_ALGO per collective; nullptr: the model picks.
  std::array<const Algorithm*, kCollectives> forced{};
  CostModel model;
  size_t pipelineChunkBytes = 4 << 20;

  static Tuning fromEnv();  // throws InvalidArgument for a bad SMDCCL_ALGO or tune file
  // Applies an SMDCCL_ALGO value: "auto", an algorithm for every collective
  // ("ring": each collective ring serves, and its kin for the others), and
  // / or "collective:algorithm" pairs ("allreduce:tree,allgather:ring"),
  // comma-separated, later entries winning. Throws InvalidArgument.
  void force(const std::string& spec);
  const Algorithm* forcedFor(Collective coll) const { return forced[static_cast<int>(coll)]; }
};

struct Choice {
  const Algorithm* algo = nullptr;
  bool forced = false;  // SMDCCL_ALGO decided it
};

// The algorithms the model weighs for `coll` (serve it, can run, may be
// picked), with their estimates, in registration order.
std::vector<std::pair<const Algorithm*, double>> estimates(Collective coll, double bytes,
                                                           const Situation& s, const CostModel& m);
// A forced algorithm applies where it can run; elsewhere its fallback does
// (two-level forms fall back to flat on one node), else the model picks.
Choice choose(Collective coll, size_t bytes, const Situation& s, const Tuning& t);

// Which hops of a group carry float32 data on the 16-bit wire.
struct WireHops {
  bool some = false;   // some hop (between nodes, or every hop with intra)
  bool every = false;  // every hop
  bool intra = false;  // inside nodes too (SMDCCL_COMPRESSION_INTRA)
};
// What selection sees of a collective on a group of shape g (the backend's
// groups: situationOf, collectives.h; any shape: plan.h).
Situation situationFor(const GroupShape& g, const WireHops& w, const Tuning& t);
// The model as the wire changes it: the compressed levels move half the bytes.
Tuning forWire(const WireHops& w, const Tuning& t);

}  // namespace smdccl
