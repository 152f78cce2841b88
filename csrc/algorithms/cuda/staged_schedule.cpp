#include "algorithms/cuda/staged_schedule.h"

#include <algorithm>

#include "algorithms/cuda/cuda_stage_device.h"

namespace smdccl {

namespace {
// A piece of at most 1 MiB per slot, so a 4 MiB staging chunk still
// pipelines inside itself; four slots per direction: one being copied in,
// one on the network, one being copied out, one spare.
constexpr size_t kRingSlotBytes = 1u << 20;
constexpr int kRingSlots = 4;
}  // namespace

bool isRingAlgorithm(const Algorithm* a) { return a == findAlgorithm("ring"); }

void runStagedSchedule(GpuContext& g, const OpContext& ctx, size_t chunkBytes, DType dt,
                       const StagedSchedule& schedule) {
  StagePlan plan;
  plan.slotBytes = std::min(kRingSlotBytes, std::max(chunkBytes, elementSize(dt)));
  plan.slots = kRingSlots;
  plan.chunkBytes = chunkBytes;
  // The previous op's copies are done: it waited for its stream at its end.
  char* slots = g.staging().reserve(plan.hostBytes());
  CudaStageDevice& d = g.stage();
  const uint64_t out0 = d.bytesToHost(), in0 = d.bytesFromHost();
  d.begin(g.stream(), slots, plan, ctx);
  try {
    schedule(d, slots, plan);
  } catch (...) {
    d.abandon();
    g.countCopies(d.bytesToHost() - out0, d.bytesFromHost() - in0);
    throw;
  }
  d.finish();
  g.countCopies(d.bytesToHost() - out0, d.bytesFromHost() - in0);
}

}  // namespace smdccl
