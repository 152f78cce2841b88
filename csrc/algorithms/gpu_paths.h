#pragma once
// The paths for CUDA tensors as registered algorithms, chosen as the host
// algorithms are (collectives.h): among the paths that serve the collective and
// can run on this group and tensor, the cheapest by its estimate. The
// choice is a pure function of plain facts (GpuFacts), so it is tested
// without a GPU; the CUDA layer runs what it names
// (algorithms/cuda/gpu_registry.cpp). Registered: nccl (inside the node,
// with the staged steps across nodes; reduce on one node), ipc (smdccl's
// CUDA IPC allreduce, reduce-scatter and allgather on one node), staged
// (through pinned host memory; always runs). A reduce that NCCL does not
// run takes the path its allreduce would.
#include <cstddef>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/cost_model.h"
#include "algorithms/gpu_tuning.h"
#include "common/dtype.h"
#include "topology/topology.h"

namespace smdccl {

struct GpuFacts {
  Collective coll = Collective::Allreduce;
  DType dt = DType::F32;
  RedOp op = RedOp::Sum;
  size_t bytes = 0;  // allreduce, broadcast: the tensor; reduce_scatter, allgather: all blocks
  // The group: its nodes, their ranks, whether every node has as many, and
  // whether the collective runs over the whole group (not a sub-group).
  int nodes = 1, localSize = 1;
  bool uniform = true, wholeGroup = true;
  bool ipcOn = true;  // SMDCCL_CUDA_IPC
  // Whether the node's engine is NCCL (intra_engine.h) and NCCL has dt and op.
  bool ncclChosen = false, ncclTypes = false;
  // The staged step across nodes: the wire it packs to (F32: none).
  Wire packWire = Wire::F32;
  CostModel model{};
  // Whether smdccl's IPC kernels can serve the node (at most this many ranks).
  static constexpr int kMaxIpcRanks = 16;
};

// The facts of the group `h` (its nodes) and the settings, for a
// collective over the whole group; the call's own facts at their defaults.
GpuFacts groupFacts(const Hierarchy& h, const GpuTuning& t);
// Whether the CUDA layer asks which engine the nodes run (a store round of
// the group's ranks, at its first CUDA collective): from the group's shape
// and settings alone, so that every rank joins the round whatever the
// call's dtype and whether this rank's NCCL has it.
bool nodeEngineAsked(const GpuFacts& f);
// Whether the NCCL path could run but for the node's engine choice.
bool ncclMayRun(const GpuFacts& f);
// Whether the NCCL path runs on f and queues all its work on the stream
// (one node): the host drives no step of it.
bool ncclQueuesWhole(const GpuFacts& f);

class GpuPath {
 public:
  virtual ~GpuPath() = default;
  virtual const char* name() const = 0;
  virtual bool serves(Collective coll) const = 0;
  virtual bool canRun(const GpuFacts& f) const = 0;
  // Estimated seconds (gpuLinks() and f.model).
  virtual double estimate(const GpuFacts& f) const = 0;
};

// Every path, in registration order (ties go to the first).
const std::vector<const GpuPath*>& gpuPaths();
// The cheapest path that serves f.coll and can run (staged always can).
const GpuPath& chooseGpuPath(const GpuFacts& f);

// What the estimates assume of a node's GPUs. Not measured yet (no GPU
// profile exists): they rank the paths that can run, NCCL's ring over
// NVLink / PCIe before smdccl's IPC steps (each step a host barrier).
struct GpuLinks {
  LevelCost nccl{8.0, 150.0};     // per NCCL call, and its bus bandwidth
  LevelCost ipcStep{30.0, 100.0};  // per IPC step (a host barrier), and device copies
  LevelCost pcie{10.0, 20.0};      // per staged copy, and device <-> pinned host
};
const GpuLinks& gpuLinks();

}  // namespace smdccl
