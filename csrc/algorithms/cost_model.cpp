#include "algorithms/cost_model.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

#include <sys/stat.h>

#include "common/error.h"

namespace smdccl {

namespace {

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

// Per-message software cost of one more chunk in a pipeline (syscalls,
// bookkeeping): what stops the pipelined scheme from cutting chunks forever.
constexpr double kPerMessageUs = 2.0;
// Sending to every peer at once contends for memory and links more than a
// ring's one-in, one-out; measured on the development VMs as ~1.5x.
constexpr double kDirectContention = 1.5;

struct Est {
  const CostModel& m;
  const GroupShape& g;
  double reduceSeconds(double bytes) const { return bytes / (m.reduceGbps * 1e9); }
  // The level a flat algorithm's slowest hop runs on.
  const LevelCost& bottleneck() const { return g.nodes > 1 ? m.inter : m.intra; }

  // Recursive doubling on a flat group: the first log2(L) rounds stay inside
  // a node (node-major ranks), the rest cross, each crossing carrying L
  // messages through the node's uplink at once.
  double rd(double bytes) const {
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
  // Recursive doubling inside one node of `local` ranks.
  double rdLocal(double bytes, int local) const {
    if (local <= 1) return 0;
    int R = floorLog2(local);
    double t = R * (m.intra.secondsFor(bytes) + reduceSeconds(bytes));
    if ((1 << R) != local) t += 2 * m.intra.secondsFor(bytes) + reduceSeconds(bytes);
    return t;
  }
  // A streaming ring of `steps` steps moving `stepBytes` each through its
  // slowest link; `reduce`: reduce-scatter steps also add.
  double ring(int steps, double stepBytes, int reduceSteps) const {
    const LevelCost& b = bottleneck();
    double alpha = g.nodes > 1 ? m.inter.alphaUs : m.intra.alphaUs;
    return steps * alpha * 1e-6 + b.bytesSeconds(steps * stepBytes) +
           reduceSeconds(reduceSteps * stepBytes);
  }
  double twoLevelRing(double bytes, size_t chunkBytes) const {
    int L = g.maxLocal, n = g.nodes;
    double A = m.intra.bytesSeconds(2.0 * (L - 1) / L * bytes) + reduceSeconds((L - 1.0) / L * bytes);
    // Each node's uplink carries 2(n-1)/n of the message, whatever L is.
    double E = m.inter.bytesSeconds(2.0 * (n - 1) / n * bytes) + reduceSeconds((n - 1.0) / n * bytes / L);
    double K = static_cast<double>(pipelineChunks(static_cast<size_t>(bytes), chunkBytes));
    double latency = 2 * (L - 1) * m.intra.alphaUs * 1e-6 + 2 * (n - 1) * m.inter.alphaUs * 1e-6;
    return latency + std::max(A, E) + std::min(A, E) / K +
           (K - 1) * 2 * (n - 1 + L - 1) * kPerMessageUs * 1e-6;
  }
  double twoLevelRd(double bytes) const {
    int n = g.nodes, R = floorLog2(n);
    double across = g.uniform ? g.maxLocal : 1;  // messages through one uplink at once
    double inter = R * (m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds(bytes * across) +
                        reduceSeconds(bytes));
    if ((1 << R) != n) inter += 2 * (m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds(bytes * across));
    double t = rdLocal(bytes, g.maxLocal) + inter;
    if (!g.uniform) t += ceilLog2(g.maxLocal) * m.intra.secondsFor(bytes);  // leaders broadcast
    return t;
  }
  double tree(double bytes) const {
    int R = ceilLog2(g.ranks);
    int Ra = g.nodes > 1 ? std::min(R, floorLog2(g.maxLocal)) : R;
    return Ra * m.intra.secondsFor(bytes) + (R - Ra) * m.inter.secondsFor(bytes);
  }
  double chain(double bytes) const {
    constexpr double kChunk = 512 << 10;
    int p = g.ranks, crossings = g.nodes - 1;
    double hops = (p - 1 - crossings) * m.intra.alphaUs * 1e-6 + crossings * m.inter.alphaUs * 1e-6;
    return hops + bottleneck().bytesSeconds(bytes + (p - 2) * std::min(bytes, kChunk));
  }
};

}  // namespace

const char* algoName(Algo a) {
  switch (a) {
    case Algo::Ring: return "ring";
    case Algo::RecursiveDoubling: return "rd";
    case Algo::TwoLevelRing: return "two_level";
    case Algo::TwoLevelRd: return "two_level_rd";
    case Algo::Direct: return "direct";
    case Algo::Tree: return "tree";
    case Algo::Chain: return "chain";
    case Algo::TwoLevelTree: return "two_level_tree";
  }
  return "?";
}

const char* collectiveName(Collective c) {
  switch (c) {
    case Collective::Allreduce: return "allreduce";
    case Collective::ReduceScatter: return "reduce_scatter";
    case Collective::Allgather: return "allgather";
    case Collective::Broadcast: return "broadcast";
  }
  return "?";
}

size_t pipelineChunks(size_t bytes, size_t chunkBytes) {
  constexpr size_t kMaxChunks = 64;  // bounds the exchange's bookkeeping
  size_t k = chunkBytes ? (bytes + chunkBytes - 1) / chunkBytes : 1;
  return std::clamp<size_t>(k, 1, kMaxChunks);
}

std::vector<Algo> candidates(Collective c, const GroupShape& g) {
  bool twoLevel = g.nodes > 1 && g.maxLocal > 1;
  switch (c) {
    case Collective::Allreduce:
      if (twoLevel) return {Algo::RecursiveDoubling, Algo::Ring, Algo::TwoLevelRd, Algo::TwoLevelRing};
      return {Algo::RecursiveDoubling, Algo::Ring};
    case Collective::ReduceScatter:
      if (twoLevel && g.uniform) return {Algo::RecursiveDoubling, Algo::Ring, Algo::TwoLevelRing};
      return {Algo::RecursiveDoubling, Algo::Ring};
    case Collective::Allgather:
      if (twoLevel && g.uniform) return {Algo::Direct, Algo::Ring, Algo::TwoLevelRing};
      return {Algo::Direct, Algo::Ring};
    case Collective::Broadcast:
      if (twoLevel) return {Algo::Tree, Algo::Chain, Algo::TwoLevelTree};
      return {Algo::Tree, Algo::Chain};
  }
  return {};
}

double estimateSeconds(Collective c, Algo a, double bytes, const GroupShape& g,
                       const CostModel& m, size_t pipelineChunkBytes) {
  Est e{m, g};
  int p = g.ranks;
  if (p <= 1) return 0;
  switch (c) {
    case Collective::Allreduce:
      switch (a) {
        case Algo::RecursiveDoubling: return e.rd(bytes);
        case Algo::Ring: return e.ring(2 * (p - 1), bytes / p, p - 1);
        case Algo::TwoLevelRing: return e.twoLevelRing(bytes, pipelineChunkBytes);
        case Algo::TwoLevelRd: return e.twoLevelRd(bytes);
        default: break;
      }
      break;
    case Collective::ReduceScatter:
      switch (a) {
        case Algo::RecursiveDoubling: return e.rd(bytes);  // an allreduce of everything
        case Algo::Ring: return e.ring(p - 1, bytes / p, p - 1);
        case Algo::TwoLevelRing: {
          int L = g.maxLocal, n = g.nodes;
          return (L - 1) * m.intra.alphaUs * 1e-6 + m.intra.bytesSeconds((L - 1.0) / L * bytes) +
                 e.reduceSeconds((L - 1.0) / L * bytes) + (n - 1) * m.inter.alphaUs * 1e-6 +
                 m.inter.bytesSeconds((n - 1.0) / n * bytes) + e.reduceSeconds((n - 1.0) / n * bytes / L);
        }
        default: break;
      }
      break;
    case Collective::Allgather:
      switch (a) {
        case Algo::Direct: {
          const LevelCost& b = e.bottleneck();
          // Through a node's uplink: its L ranks' blocks to every other node's ranks.
          double through = g.nodes > 1 ? g.maxLocal * (p - g.maxLocal) * bytes / p : (p - 1) * bytes / p;
          return b.alphaUs * 1e-6 + b.bytesSeconds(through) * (p > 2 ? kDirectContention : 1.0);
        }
        case Algo::Ring: return e.ring(p - 1, bytes / p, 0);
        case Algo::TwoLevelRing: {
          int L = g.maxLocal, n = g.nodes;
          return (L - 1) * m.intra.alphaUs * 1e-6 + m.intra.bytesSeconds((L - 1.0) / L * bytes) +
                 (n - 1) * m.inter.alphaUs * 1e-6 + m.inter.bytesSeconds((n - 1.0) / n * bytes);
        }
        default: break;
      }
      break;
    case Collective::Broadcast:
      switch (a) {
        case Algo::Tree: return e.tree(bytes);
        case Algo::Chain: return e.chain(bytes);
        case Algo::TwoLevelTree:
          return ceilLog2(g.nodes) * m.inter.secondsFor(bytes) +
                 ceilLog2(g.maxLocal) * m.intra.secondsFor(bytes);
        default: break;
      }
      break;
  }
  return std::numeric_limits<double>::infinity();
}

Algo cheapest(Collective c, double bytes, const GroupShape& g, const CostModel& m,
              size_t pipelineChunkBytes) {
  auto cands = candidates(c, g);
  Algo best = cands.front();
  double bestT = std::numeric_limits<double>::infinity();
  for (Algo a : cands) {
    double t = estimateSeconds(c, a, bytes, g, m, pipelineChunkBytes);
    if (t < bestT) {
      bestT = t;
      best = a;
    }
  }
  return best;
}

CostModel CostModel::fromFile(const std::string& path) {
  // A profile is a few lines: anything but a small regular file (a device,
  // a FIFO, a huge file) is a wrong path, and reading it could block or eat
  // memory before the group's timeout applies.
  struct stat st {};
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
