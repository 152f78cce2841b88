#pragma once
// One op's staged rounds (staged_rounds.h) on the group's GPU: the slots
// reserved in the group's pinned staging buffer, the CUDA StageDevice
// begun on the op's stream, each schedule planned on it and run at once
// (its proxy queues each copy as the host reaches it), its PCIe bytes
// counted.
#include <cstddef>
#include <memory>

#include "algorithms/cuda/cuda_stage_device.h"
#include "algorithms/cuda/gpu_context.h"
#include "algorithms/staged_rounds.h"

namespace smdccl {

class StagedOnGpu {
 public:
  struct Spec {
    SlotLayout layout;     // the pinned slots (and their packing scratch)
    bool scratch = false;  // whether any schedule packs to a 16-bit wire
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
  // Runs a schedule planned on device() (nullptr: nothing to do); the op's
  // stream waits for its copies from here on.
  void run(std::unique_ptr<StagedProxy> proxy);
  // After the op's last schedule: the op's stream waits for every copy,
  // and fp16 overflows of the packing are counted on this thread.
  void finish();

 private:
  GpuContext& g_;
  CudaStageDevice& d_;
  char* slots_;
  uint64_t out0_, in0_;
  bool finished_ = false;
};

// An op's one schedule (staged_collectives.h) on c's GPU, its slots laid out
// as the job asks: a small op reserves only what its rounds use.
void runStagedRounds(Comm& c, GpuContext& g, StagedRoundsJob job);

}  // namespace smdccl
