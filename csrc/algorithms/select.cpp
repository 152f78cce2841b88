#include "algorithms/select.h"

#include <algorithm>

#include "common/env.h"
#include "common/error.h"

namespace smdccl {

Tuning Tuning::fromEnv() {
  Tuning t;
  std::string algo = envString(env::kAlgo);
  if (algo == "ring") t.forced = Algo::Ring;
  else if (algo == "rd" || algo == "recursive_doubling") t.forced = Algo::RecursiveDoubling;
  else if (algo == "two_level") t.forced = Algo::TwoLevelRing;
  else if (algo == "two_level_rd") t.forced = Algo::TwoLevelRd;
  else if (algo != "auto")
    throw InvalidArgument("SMDCCL_ALGO='" + algo +
                          "' is not one of: auto, ring, rd, two_level, two_level_rd");
  std::string file = envString(env::kTuneFile);
  if (!file.empty()) t.model = CostModel::fromFile(file);
  t.pipelineChunkBytes = static_cast<size_t>(envInt(env::kPipelineChunkKB)) << 10;  // 1 KiB and up
  return t;
}

namespace {

// What a forced allreduce algorithm means for another collective.
Algo forcedFor(Collective c, Algo forced, const GroupShape& g) {
  bool twoLevel = forced == Algo::TwoLevelRing || forced == Algo::TwoLevelRd;
  switch (c) {
    case Collective::Allreduce: return forced;
    case Collective::ReduceScatter:
      return twoLevel ? Algo::TwoLevelRing : forced;
    case Collective::Allgather:
      return twoLevel ? Algo::TwoLevelRing : forced == Algo::Ring ? Algo::Ring : Algo::Direct;
    case Collective::Broadcast:
      return twoLevel ? Algo::TwoLevelTree : forced == Algo::Ring ? Algo::Chain : Algo::Tree;
  }
  return forced;
}

}  // namespace

Algo choose(Collective c, size_t bytes, const GroupShape& g, const Tuning& t) {
  if (!t.forced) return cheapest(c, static_cast<double>(bytes), g, t.model, t.pipelineChunkBytes);
  Algo a = forcedFor(c, *t.forced, g);
  auto cands = candidates(c, g);
  if (std::find(cands.begin(), cands.end(), a) != cands.end()) return a;
  // Two-level forms need several nodes (and, for reduce-scatter/allgather,
  // uniform ones): run the flat form there.
  if (a == Algo::TwoLevelRd) return Algo::RecursiveDoubling;
  if (a == Algo::TwoLevelTree) return Algo::Tree;
  return Algo::Ring;
}

}  // namespace smdccl
