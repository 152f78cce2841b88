#include "algorithms/cuda/staged_schedule.h"

#include <algorithm>

namespace smdccl {

namespace {
// Adds what `d` copied since (out0, in0) to the group's PCIe counters.
void countSince(GpuContext& g, const StageDevice& d, uint64_t out0, uint64_t in0) {
  g.countCopies(d.bytesToHost() - out0, d.bytesFromHost() - in0);
}

// A piece of at most 1 MiB per slot, so a 4 MiB staging chunk still
// pipelines inside itself; four slots per direction: one being copied in,
// one on the network, one being copied out, one spare.
constexpr size_t kRingSlotBytes = 1u << 20;
constexpr int kRingSlots = 4;
}  // namespace

bool isRingAlgorithm(const Algorithm* a) { return a == findAlgorithm("ring"); }

StagePlan stagedRingPlan(size_t chunkBytes, DType dt) {
  StagePlan plan;
  plan.slotBytes = std::min(kRingSlotBytes, std::max(chunkBytes, elementSize(dt)));
  plan.slots = kRingSlots;
  plan.chunkBytes = chunkBytes;
  return plan;
}

StagedOnGpu::StagedOnGpu(GpuContext& g, const OpContext& ctx, const Spec& spec)
    : g_(g), spec_(spec), d_(g.stage()), whole_(spec.whole && d_.gated()) {
  // Every copy of earlier ops has run: their proxies waited for them.
  // The ring's slots only where a ring may be planned (it needs the scratch).
  slots_ = g.staging().reserve(spec.scratch ? std::max(spec.plan.hostBytes(), spec.hostBytes)
                                            : spec.hostBytes);
  out0_ = d_.bytesToHost();
  in0_ = d_.bytesFromHost();
  d_.begin(g.stream(), slots_, spec.plan, ctx, spec.scratch);
}

StagedOnGpu::~StagedOnGpu() {
  if (finished_) return;
  proxies_.clear();  // each lets go of its planned copies
  d_.abandon();
  d_.fail();
  countSince(g_, d_, out0_, in0_);
}

StageDevice& StagedOnGpu::device() {
  // Also for the first: the op may have queued steps of its own since begin().
  d_.followStream();
  return d_;
}

void StagedOnGpu::add(std::unique_ptr<StagedProxy> proxy) {
  d_.joinStream();
  if (!proxy) return;
  if (whole_) proxies_.push_back(std::move(proxy));
  else proxy->run();
}

void StagedOnGpu::finish() {
  d_.queueEnd();
  finished_ = true;
  if (!whole_) {
    d_.finish();
    countSince(g_, d_, out0_, in0_);
    return;
  }
  // After the op's body (GpuContext::afterQueued): the proxies run once the
  // op's end is marked behind all of its GPU work.
  auto proxies = std::make_shared<std::vector<std::unique_ptr<StagedProxy>>>(std::move(proxies_));
  g_.afterQueued([&g = g_, &d = d_, proxies, out0 = out0_, in0 = in0_] {
    try {
      for (auto& p : *proxies) p->run();
      d.finish();
    } catch (...) {
      proxies->clear();  // each lets go of its planned copies
      d.abandon();
      countSince(g, d, out0, in0);
      throw;
    }
    countSince(g, d, out0, in0);
  });
}

}  // namespace smdccl
