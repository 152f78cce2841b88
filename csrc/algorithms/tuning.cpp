#include "algorithms/tuning.h"

#include <sstream>

#include "common/env.h"
#include "common/error.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_TEXT(kAlgo, "SMDCCL_ALGO", "auto",
                "Force algorithms: auto (cheapest by the cost model), a registered name for "
                "every collective it runs (ring, rd, halving, tree, direct, chain, two_level, "
                "two_level_rd, two_level_tree, two_level_int8, two_level_int8_halving; a "
                "collective it does not run gets its kin, e.g. "
                "ring -> chain for broadcast), and/or collective:name pairs, e.g. "
                "allreduce:tree,allgather:ring. A two-level name on one node runs its flat form. "
                "ring also keeps compressed reductions on the ring. docs/algorithms.md lists "
                "them.");
SMDCCL_ENV_TEXT(kTuneFile, "SMDCCL_TUNE_FILE", "",
                "Cost-model profile written by `python -m smdccl.tune` (latency and bandwidth per "
                "level); unset: built-in defaults.");
SMDCCL_ENV_INT(kPipelineChunkKB, "SMDCCL_PIPELINE_CHUNK_KB", 4096, 1, 1 << 20,
               "Chunk size of the pipelined two-level allreduces (and of the halving allreduce), "
               "in KiB: while one chunk crosses the network the next is reduced inside the "
               "node.");
}  // namespace env

Tuning Tuning::fromEnv() {
  Tuning t;
  t.force(envString(env::kAlgo));
  std::string file = envString(env::kTuneFile);
  if (!file.empty()) t.model = CostModel::fromFile(file);
  t.pipelineChunkBytes = static_cast<size_t>(envInt(env::kPipelineChunkKB)) << 10;  // 1 KiB and up
  return t;
}

namespace {

std::string servedBy(const Algorithm& a) {
  std::string out;
  for (int k = 0; k < kCollectives; ++k)
    if (a.serves(static_cast<Collective>(k)))
      out += strCat(out.empty() ? "" : ", ", collectiveName(static_cast<Collective>(k)));
  return out;
}

[[noreturn]] void badSpec(const std::string& spec, const std::string& why) {
  throw InvalidArgument(
      strCat("SMDCCL_ALGO='", spec, "': ", why, ". Give one of: auto, ", algorithmNames(),
             "; or collective:algorithm pairs, e.g. allreduce:tree,allgather:ring"));
}

}  // namespace

void Tuning::force(const std::string& spec) {
  forced.fill(nullptr);
  std::stringstream items(spec);
  std::string item;
  while (std::getline(items, item, ',')) {
    if (item.empty() || item == "auto") continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      const Algorithm* a = findAlgorithm(item);
      if (!a) badSpec(spec, strCat("'", item, "' is not a registered algorithm"));
      for (int k = 0; k < kCollectives; ++k) {
        Collective coll = static_cast<Collective>(k);
        const char* kin = a->serves(coll) ? a->name() : a->kin(coll);
        forced[k] = kin ? findAlgorithm(kin) : nullptr;
      }
      continue;
    }
    std::string collName = item.substr(0, colon), name = item.substr(colon + 1);
    Collective coll;
    if (!collectiveFromName(collName, &coll))
      badSpec(spec, strCat("'", collName,
                           "' is not a collective (allreduce, reduce_scatter, "
                           "allgather, broadcast, reduce)"));
    if (name == "auto") {
      forced[static_cast<int>(coll)] = nullptr;
      continue;
    }
    const Algorithm* a = findAlgorithm(name);
    if (!a) badSpec(spec, strCat("'", name, "' is not a registered algorithm"));
    if (!a->serves(coll))
      badSpec(spec,
              strCat("'", name, "' does not run ", collName, " (it runs ", servedBy(*a), ")"));
    forced[static_cast<int>(coll)] = a;
  }
}

}  // namespace smdccl
