#pragma once
// A group's algorithm settings: SMDCCL_ALGO's forced choices, the cost
// model (built-in or SMDCCL_TUNE_FILE's profile), the pipelines' chunk.
// Read once per group; the algorithms read them as they run.
#include <array>
#include <cstddef>
#include <string>

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

}  // namespace smdccl
