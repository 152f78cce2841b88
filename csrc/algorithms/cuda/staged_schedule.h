#pragma once
// Runs a staged-ring schedule (staged_ring.h) on the group's GPU: the plan
// (four 1 MiB pinned slots per direction, whatever the size), the slots
// reserved in the group's pinned staging buffer, the CUDA StageDevice begun
// and finished around it (abandoned on a failure), its PCIe bytes counted.
#include <cstddef>
#include <functional>

#include "algorithms/algorithm.h"
#include "algorithms/cuda/gpu_context.h"
#include "algorithms/staged_ring.h"

namespace smdccl {

// Whether `a` is the ring: a staged device path runs its own ring only
// where the host path would, so that results keep the host path's bits.
bool isRingAlgorithm(const Algorithm* a);

using StagedSchedule = std::function<void(StageDevice& d, char* slots, const StagePlan& plan)>;
// `chunkBytes`: the plan's chunk (the host path's staging chunk); `dt`: the
// data's type. Returns once the schedule has run; the op's stream then
// waits for every copy of it.
void runStagedSchedule(GpuContext& g, const OpContext& ctx, size_t chunkBytes, DType dt,
                       const StagedSchedule& schedule);

}  // namespace smdccl
