#pragma once
// Which algorithm runs for a collective of a given size on a given group:
// the cheapest by the cost model (measured profile from SMDCCL_TUNE_FILE, or
// built-in defaults), unless SMDCCL_ALGO forces one.
#include <cstddef>
#include <optional>
#include <string>

#include "algorithms/cost_model.h"

namespace smdccl {

struct Tuning {
  std::optional<Algo> forced;  // SMDCCL_ALGO (ring, rd, two_level, two_level_rd)
  CostModel model;
  size_t pipelineChunkBytes = 4 << 20;

  static Tuning fromEnv();  // throws InvalidArgument for a bad SMDCCL_ALGO or tune file
};

// The algorithm for `c` on `bytes` (see estimateSeconds for what bytes
// means). A forced algorithm applies where it can run; elsewhere the
// nearest one does (two-level forms fall back to flat on one node).
Algo choose(Collective c, size_t bytes, const GroupShape& g, const Tuning& t);

}  // namespace smdccl
