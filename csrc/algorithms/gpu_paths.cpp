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

enum class IpcShape { OneShot, TwoShot, TwoLevel };

class IpcAllreducePath final : public GpuPath {
 public:
  IpcAllreducePath(const char* name, IpcShape shape) : name_(name), shape_(shape) {}
  const char* name() const override { return name_; }
  // Reduce: the allreduce, its result kept on the root.
  bool serves(Collective coll) const override {
    return coll == Collective::Allreduce || coll == Collective::Reduce;
  }
  bool canRun(const GpuFacts& f) const override {
    if (!ipcMayRun(f)) return false;
    const bool small = f.bytes <= f.oneShotBytes;
    if (shape_ == IpcShape::TwoLevel) return f.nodes > 1;
    return f.nodes == 1 && small == (shape_ == IpcShape::OneShot);
  }
  double estimate(const GpuFacts& f) const override {
    const LevelCost& step = gpuLinks().ipcStep;
    if (shape_ == IpcShape::OneShot)  // copy in, read every peer's buffer: 2 steps
      return 2 * step.alphaUs * 1e-6 + step.bytesSeconds(f.bytes * f.localSize);
    // copy in, reduce a slice, gather: 3 steps (a fourth across nodes)
    double sec = 3 * step.alphaUs * 1e-6 + step.bytesSeconds(f.bytes * 3.0);
    if (shape_ == IpcShape::TwoLevel)
      sec += step.alphaUs * 1e-6 + stagedSeconds(f, f.bytes / f.localSize, f.nodes);
    return sec;
  }

 private:
  const char* name_;
  IpcShape shape_;
};

class IpcScatterGatherPath final : public GpuPath {
 public:
  const char* name() const override { return "ipc"; }
  bool serves(Collective coll) const override {
    return coll == Collective::ReduceScatter || coll == Collective::Allgather;
  }
  bool canRun(const GpuFacts& f) const override { return ipcMayRun(f) && f.nodes == 1; }
  double estimate(const GpuFacts& f) const override {
    const LevelCost& step = gpuLinks().ipcStep;  // copy in, read every peer's piece
    return 2 * step.alphaUs * 1e-6 + step.bytesSeconds(2.0 * f.bytes);
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
  f.oneShotBytes = t.oneShotBytes;
  return f;
}

bool nodeEngineAsked(const GpuFacts& f) { return nodeEngineMayRun(f); }

bool ncclMayRun(const GpuFacts& f) { return nodeEngineMayRun(f) && f.ncclTypes; }

bool ncclQueuesWhole(const GpuFacts& f) { return ncclMayRun(f) && f.ncclChosen && f.nodes == 1; }

const std::vector<const GpuPath*>& gpuPaths() {
  static const NcclPath nccl;
  static const IpcAllreducePath oneShot("ipc_one_shot", IpcShape::OneShot),
      twoShot("ipc_two_shot", IpcShape::TwoShot), twoLevel("two_level_ipc", IpcShape::TwoLevel);
  static const IpcScatterGatherPath ipc;
  static const StagedPath staged;
  static const std::vector<const GpuPath*> all = {&nccl,     &oneShot, &twoShot,
                                                  &twoLevel, &ipc,     &staged};
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
