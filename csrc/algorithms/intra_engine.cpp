#include "algorithms/intra_engine.h"

#include <set>

#include "common/error.h"

namespace smdccl {

const char* intraEngineName(IntraEngine e) { return e == IntraEngine::Nccl ? "nccl" : "ipc"; }

IntraChoice chooseIntraEngine(const std::string& setting, const std::vector<IntraRank>& ranks) {
  if (setting == "ipc") return {IntraEngine::Ipc, "SMDCCL_INTRA=ipc"};
  for (size_t r = 0; r < ranks.size(); ++r)
    if (!ranks[r].ncclLoaded) {
      const std::string why = strCat("local rank ", r, " cannot load NCCL: ", ranks[r].ncclWhy);
      SMDCCL_CHECK_ARG(setting != "nccl", "smdccl: SMDCCL_INTRA=nccl, but ", why);
      return {IntraEngine::Ipc, why};
    }
  if (setting == "nccl") return {IntraEngine::Nccl, "SMDCCL_INTRA=nccl"};
  std::set<std::string> gpus;
  for (const IntraRank& r : ranks) gpus.insert(r.gpu);
  if (gpus.size() < ranks.size())
    return {IntraEngine::Ipc, strCat(ranks.size(), " ranks share ", gpus.size(),
                                     gpus.size() == 1 ? " GPU" : " GPUs",
                                     " (NCCL needs one GPU per rank)")};
  return {IntraEngine::Nccl, strCat("every rank of the node has a GPU of its own")};
}

IntraChoice chooseGroupEngine(const std::string& setting,
                              const std::vector<std::vector<IntraRank>>& nodes) {
  for (size_t n = 0; n < nodes.size(); ++n) {
    IntraChoice node = chooseIntraEngine(setting, nodes[n]);
    if (nodes.size() == 1) return node;
    if (node.engine == IntraEngine::Ipc) return {node.engine, strCat("node ", n, ": ", node.why)};
  }
  return {IntraEngine::Nccl, setting == "nccl" ? "SMDCCL_INTRA=nccl"
                                               : "every rank of every node has a GPU of its own"};
}

std::string encodeIntraRank(const IntraRank& r) {
  // The bus id has no '|'; the reason may: it goes last.
  return strCat(r.gpu, "|", r.ncclLoaded ? 1 : 0, "|", r.ncclWhy);
}

IntraRank decodeIntraRank(const std::string& s) {
  IntraRank r;
  const size_t a = s.find('|'), b = a == std::string::npos ? a : s.find('|', a + 1);
  SMDCCL_CHECK_ARG(b != std::string::npos, "smdccl: a malformed intra-node report: '", s, "'");
  r.gpu = s.substr(0, a);
  r.ncclLoaded = s.substr(a + 1, b - a - 1) == "1";
  r.ncclWhy = s.substr(b + 1);
  return r;
}

}  // namespace smdccl
