#pragma once
// One op's staged schedules (staged_ring.h, staged_rounds.h) on the group's
// GPU: the slots reserved in the group's pinned staging buffer, the CUDA
// StageDevice begun on the op's stream, each schedule planned on it, its
// PCIe bytes counted. Where the op can be queued whole (a gated device, and
// the op's other steps on its stream too), the proxies run after the op's
// body, once its end is marked behind all of its GPU work
// (GpuContext::afterQueued(): Work.wait() returns then, and a blocking call
// too); otherwise each schedule runs as soon as it is planned, as the
// host-driven path did.
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/cuda/cuda_stage_device.h"
#include "algorithms/cuda/gpu_context.h"
#include "algorithms/staged_ring.h"

namespace smdccl {

// Whether `a` is the ring: a staged device path runs its own ring only
// where the host path would, so that results keep the host path's bits.
bool isRingAlgorithm(const Algorithm* a);

// The staged ring's plan for the op: four 1 MiB pinned slots per direction
// whatever the size, `chunkBytes` (the host path's staging chunk) a chunk.
StagePlan stagedRingPlan(size_t chunkBytes, DType dt);

class StagedOnGpu {
 public:
  struct Spec {
    StagePlan plan;        // the ring's slots and device scratch
    size_t hostBytes = 0;  // pinned bytes at least (staged rounds)
    bool scratch = true;   // whether any schedule packs or reduces
    bool whole = false;    // the op's other steps are queued on its stream
  };
  StagedOnGpu(GpuContext& g, const OpContext& ctx, const Spec& spec);
  // Not finished (a failure): the planned copies are let go, the op's
  // stream waits for what was queued.
  ~StagedOnGpu();
  StagedOnGpu(const StagedOnGpu&) = delete;
  StagedOnGpu& operator=(const StagedOnGpu&) = delete;

  // The device to plan the next schedule on; its copies wait for what the
  // op's stream has queued so far.
  StageDevice& device();
  char* slots() const { return slots_; }
  const StagePlan& plan() const { return spec_.plan; }
  // A schedule planned on device() (nullptr: nothing to do): the op's
  // stream waits for its copies from here on. Run now unless queued whole.
  void add(std::unique_ptr<StagedProxy> proxy);
  // After the op's last schedule: the op's stream waits for every copy;
  // the proxies left run (now, or after the op's body when it is queued
  // whole), and fp16 overflows are counted on this thread.
  void finish();
  // Whether the proxies wait for finish().
  bool whole() const { return whole_; }

 private:
  GpuContext& g_;
  Spec spec_;
  CudaStageDevice& d_;
  bool whole_;
  char* slots_;
  uint64_t out0_, in0_;
  bool finished_ = false;
  std::vector<std::unique_ptr<StagedProxy>> proxies_;
};

}  // namespace smdccl
