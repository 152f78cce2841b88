// The staged paths (algorithms/gpu_paths.h): a collective's rounds
// (staged_collectives.h) run on the group's CUDA StageDevice through its
// pinned staging buffer, the PCIe bytes counted. The NCCL and IPC paths
// stage their across-nodes steps here too.
#include "algorithms/cuda/cuda_stage_device.h"
#include "algorithms/cuda/gpu_collectives.h"
#include "algorithms/staged_collectives.h"

namespace smdccl {

namespace {

// An op's one schedule, its slots laid out as the job asks: a small op
// reserves only what its rounds use.
void runOnGpu(Comm& c, GpuContext& g, StagedRoundsJob job) {
  // Every copy of earlier ops has run: their runs waited for them.
  char* slots = g.staging().reserve(job.hostBytes());
  CudaStageDevice& d = g.stage();
  const uint64_t out0 = d.bytesToHost(), in0 = d.bytesFromHost();
  auto count = [&] { g.countCopies(d.bytesToHost() - out0, d.bytesFromHost() - in0); };
  try {
    d.run(g.stream(), slots, c.ctx, std::move(job));
  } catch (...) {
    count();
    throw;
  }
  count();
}

}  // namespace

void stagedAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  if (a.count == 0 || c.size() == 1) return;
  runOnGpu(c, g, allreduceRounds(c, a, g.tuning().stageChunkBytes, t));
}

void stagedReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t) {
  runOnGpu(c, g, reduceScatterRounds(c, r, t));
}

void stagedAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t) {
  runOnGpu(c, g, allgatherRounds(c, b, g.tuning().stageChunkBytes, t));
}

void stagedBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  runOnGpu(c, g,
           broadcastRounds(c,
                           {.buf = a.buf,
                            .bytes = a.bytes,
                            .root = a.root,
                            .roundBytes = g.tuning().stageChunkBytes},
                           t));
}

}  // namespace smdccl
