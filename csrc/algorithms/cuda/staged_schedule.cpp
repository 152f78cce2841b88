#include "algorithms/cuda/staged_schedule.h"

#include "algorithms/comm.h"

namespace smdccl {

namespace {
// Adds what `d` copied since (out0, in0) to the group's PCIe counters.
void countSince(GpuContext& g, const StageDevice& d, uint64_t out0, uint64_t in0) {
  g.countCopies(d.bytesToHost() - out0, d.bytesFromHost() - in0);
}
}  // namespace

StagedOnGpu::StagedOnGpu(GpuContext& g, const OpContext& ctx, const Spec& spec)
    : g_(g), d_(g.stage()) {
  // Every copy of earlier ops has run: their proxies waited for them.
  slots_ = g.staging().reserve(spec.layout.hostBytes());
  out0_ = d_.bytesToHost();
  in0_ = d_.bytesFromHost();
  d_.begin(g.stream(), slots_, spec.layout, ctx, spec.scratch);
}

StagedOnGpu::~StagedOnGpu() {
  if (finished_) return;
  d_.abandon();
  d_.fail();
  countSince(g_, d_, out0_, in0_);
}

StageDevice& StagedOnGpu::device() {
  // Also for the first: the op may have queued steps of its own since begin().
  d_.followStream();
  return d_;
}

void StagedOnGpu::run(std::unique_ptr<StagedProxy> proxy) {
  if (proxy) proxy->run();
  d_.joinStream();
}

void StagedOnGpu::finish() {
  d_.queueEnd();
  finished_ = true;
  d_.finish();
  countSince(g_, d_, out0_, in0_);
}

void runStagedRounds(Comm& c, GpuContext& g, StagedRoundsJob job) {
  const bool packs = StageDevice::packed(job.dt, job.wire) || job.hasInt8();
  StagedOnGpu staged(
      g, c.ctx, {.layout = {.slotBytes = job.slotBytes, .slots = job.slots}, .scratch = packs});
  StageDevice& d = staged.device();
  staged.run(planStagedRounds(c.ctx, d, std::move(job), staged.slots()));
  staged.finish();
}

}  // namespace smdccl
