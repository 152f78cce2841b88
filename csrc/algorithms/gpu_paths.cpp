#include "algorithms/gpu_paths.h"

#include <limits>
#include <stdexcept>

#include "common/error.h"

namespace smdccl {

namespace {

// What both engines inside a node need: the whole group, SMDCCL_CUDA_IPC
// on, nodes of equal size with node-mates.
bool nodeEngineMayRun(const GpuFacts& f) {
  return f.wholeGroup && f.ipcOn && f.localSize > 1 && f.uniform;
}

// Not where the node chose NCCL: its ranks then have GPUs of their own, and
// smdccl's IPC kernels would read peers' memory across GPUs that may have
// no peer access (PCIe without P2P), which NCCL handles and they do not.
bool ipcMayRun(const GpuFacts& f) {
  return nodeEngineMayRun(f) && !f.ncclChosen && f.localSize <= GpuFacts::kMaxIpcRanks;
}

// The staged step: `bytes` out and back over PCIe and a host ring over the
// nodes (packed where the group compresses), on the model's inter-node link.
double stagedSeconds(const GpuFacts& f, double bytes, int ranks) {
  if (ranks < 2) return 0;
  const double p = ranks, wire = f.packWire == Wire::F32 ? bytes : bytes / 2;
  const LevelCost& net = f.model.inter;
  return 2 * gpuLinks().pcie.secondsFor(wire) + 2 * (p - 1) * net.alphaUs * 1e-6 +
         2 * (p - 1) / p * net.bytesSeconds(wire);
}

class NcclPath final : public GpuPath {
 public:
  const char* name() const override { return "nccl"; }
  // Reduce: NCCL's on one node, across nodes NCCL's allreduce.
  bool serves(Collective) const override { return true; }
  bool canRun(const GpuFacts& f) const override { return ncclMayRun(f) && f.ncclChosen; }
  double estimate(const GpuFacts& f) const override {
    // NCCL's ring inside the node (allreduce: a reduce-scatter and an
    // allgather; the others: one call per node's region); across nodes,
    // each rank's share of the blocks staged (broadcast: the whole tensor).
    const double local = f.localSize;
    const LevelCost& link = gpuLinks().nccl;
    const bool allreduce =
        f.coll == Collective::Allreduce || (f.coll == Collective::Reduce && f.nodes > 1);
    const double calls = allreduce ? 2 : f.nodes, passes = allreduce ? 2 : 1;
    const double across = f.coll == Collective::Broadcast ? f.bytes : f.bytes / local;
    return calls * link.alphaUs * 1e-6 + passes * (local - 1) / local * link.bytesSeconds(f.bytes) +
           stagedSeconds(f, across, f.nodes);
  }
};

// One node: every rank's data into its IPC buffer, then each reads every
// node-mate's (gpu_ipc.cpp). Reduce: the allreduce, its result kept on the root.
class IpcPath final : public GpuPath {
 public:
  const char* name() const override { return "ipc"; }
  bool serves(Collective coll) const override { return coll != Collective::Broadcast; }
  bool canRun(const GpuFacts& f) const override { return ipcMayRun(f) && f.nodes == 1; }
  double estimate(const GpuFacts& f) const override {
    // Two steps: copy in, read every peer's buffer (an allreduce the whole
    // tensor from each, the others one block from each).
    const LevelCost& step = gpuLinks().ipcStep;
    const bool whole = f.coll == Collective::Allreduce || f.coll == Collective::Reduce;
    return 2 * step.alphaUs * 1e-6 +
           step.bytesSeconds(whole ? f.bytes * f.localSize : 2.0 * f.bytes);
  }
};

class StagedPath final : public GpuPath {
 public:
  const char* name() const override { return "staged"; }
  bool serves(Collective) const override { return true; }  // reduce: the allreduce
  bool canRun(const GpuFacts&) const override { return true; }
  double estimate(const GpuFacts& f) const override {
    return stagedSeconds(f, static_cast<double>(f.bytes), f.nodes * f.localSize);
  }
};

}  // namespace

GpuFacts groupFacts(const Hierarchy& h, const GpuTuning& t) {
  GpuFacts f;
  f.nodes = h.numNodes();
  f.localSize = h.localSize();
  f.uniform = h.uniform();
  f.ipcOn = t.ipc;
  return f;
}

bool nodeEngineAsked(const GpuFacts& f) { return nodeEngineMayRun(f); }

bool ncclMayRun(const GpuFacts& f) { return nodeEngineMayRun(f) && f.ncclTypes; }

bool ncclQueuesWhole(const GpuFacts& f) { return ncclMayRun(f) && f.ncclChosen && f.nodes == 1; }

const std::vector<const GpuPath*>& gpuPaths() {
  static const NcclPath nccl;
  static const IpcPath ipc;
  static const StagedPath staged;
  static const std::vector<const GpuPath*> all = {&nccl, &ipc, &staged};
  return all;
}

const GpuPath& chooseGpuPath(const GpuFacts& f) {
  const GpuPath* best = nullptr;
  double bestT = std::numeric_limits<double>::infinity();
  for (const GpuPath* p : gpuPaths()) {
    if (!p->serves(f.coll) || !p->canRun(f)) continue;
    const double sec = p->estimate(f);
    if (!best || sec < bestT) {
      best = p;
      bestT = sec;
    }
  }
  if (!best) throw std::logic_error(strCat("no CUDA path runs ", collectiveName(f.coll)));
  return *best;
}

const GpuLinks& gpuLinks() {
  static const GpuLinks links;
  return links;
}

}  // namespace smdccl
