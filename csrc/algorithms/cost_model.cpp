#include "algorithms/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <sys/stat.h>

#include "common/error.h"

namespace smdccl {

int floorLog2(int p) {
  int r = 0;
  while ((2 << r) <= p) ++r;
  return r;
}

int ceilLog2(int p) {
  int r = 0;
  while ((1 << r) < p) ++r;
  return r;
}

size_t pipelineChunks(size_t bytes, size_t chunkBytes) {
  constexpr size_t kMaxChunks = 64;  // bounds the exchange's bookkeeping
  size_t k = chunkBytes ? (bytes + chunkBytes - 1) / chunkBytes : 1;
  return std::clamp<size_t>(k, 1, kMaxChunks);
}

double Costs::ring(int steps, double stepBytes, int reduceSteps) const {
  const LevelCost& b = bottleneck();
  return steps * b.alphaUs * 1e-6 + b.bytesSeconds(steps * stepBytes) +
         reduceSeconds(reduceSteps * stepBytes);
}

// The first log2(L) rounds stay inside a node (node-major ranks), the rest
// cross, each crossing carrying L messages through the node's uplink at once.
double Costs::rd(double bytes) const {
  int p = g.ranks, R = floorLog2(p);
  // Uneven nodes: a small node's ranks cross in every round.
  int Ra = g.nodes == 1 ? R : g.uniform ? std::min(R, floorLog2(g.maxLocal)) : 0;
  int Re = R - Ra;
  double t = Ra * (m.intra.secondsFor(bytes) + reduceSeconds(bytes)) +
             Re * (m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds(bytes * g.maxLocal) +
                   reduceSeconds(bytes));
  if ((1 << R) != p) {
    // Ranks fold into their neighbour: inside a node only when nodes pair up evenly.
    bool foldInside = g.nodes == 1 || (g.uniform && g.maxLocal % 2 == 0);
    const LevelCost& fold = foldInside ? m.intra : m.inter;
    t += 2 * fold.secondsFor(bytes) + reduceSeconds(bytes);
  }
  return t;
}

double Costs::rdLocal(double bytes, int local) const {
  if (local <= 1) return 0;
  int R = floorLog2(local);
  double t = R * (m.intra.secondsFor(bytes) + reduceSeconds(bytes));
  if ((1 << R) != local) t += 2 * m.intra.secondsFor(bytes) + reduceSeconds(bytes);
  return t;
}

double Costs::binomialTree(double bytes) const {
  int R = ceilLog2(g.ranks);
  int Ra = g.nodes > 1 ? std::min(R, floorLog2(g.maxLocal)) : R;
  return Ra * m.intra.secondsFor(bytes) + (R - Ra) * m.inter.secondsFor(bytes);
}

CostModel CostModel::fromFile(const std::string& path) {
  // A profile is a few lines: anything but a small regular file (a device,
  // a FIFO, a huge file) is a wrong path, and reading it could block or eat
  // memory before the group's timeout applies.
  struct stat st{};
  SMDCCL_CHECK_ARG(::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size <= (1 << 20),
                   "SMDCCL_TUNE_FILE='", path,
                   "' is not a readable profile (a regular file of at most 1 MiB); write one "
                   "with `python -m smdccl.tune` or unset it");
  std::ifstream in(path);
  SMDCCL_CHECK_ARG(in.good(), "SMDCCL_TUNE_FILE='", path,
                   "' cannot be read; write one with `python -m smdccl.tune` or unset it");
  CostModel m;
  m.source = path;
  std::string line;
  int lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string key;
    double v = 0;
    if (!(ls >> key)) continue;
    std::string rest;
    SMDCCL_CHECK_ARG(static_cast<bool>(ls >> v) && !(ls >> rest) && std::isfinite(v) && v > 1e-9,
                     path, ":", lineNo, ": '", key, "' needs a positive number, alone on its line");
    if (key == "intra_alpha_us") m.intra.alphaUs = v;
    else if (key == "intra_gbps") m.intra.gbps = v;
    else if (key == "inter_alpha_us") m.inter.alphaUs = v;
    else if (key == "inter_gbps") m.inter.gbps = v;
    else if (key == "reduce_gbps") m.reduceGbps = v;
    else
      SMDCCL_CHECK_ARG(false, path, ":", lineNo, ": unknown key '", key,
                       "' (known: intra_alpha_us, intra_gbps, inter_alpha_us, inter_gbps, "
                       "reduce_gbps)");
  }
  return m;
}

std::string CostModel::describe() const {
  std::ostringstream s;
  s << "intra " << intra.alphaUs << " us + " << intra.gbps << " GB/s, inter " << inter.alphaUs
    << " us + " << inter.gbps << " GB/s, reduce " << reduceGbps << " GB/s (" << source << ")";
  return s.str();
}

}  // namespace smdccl
