// Tensor fusion of small async allreduces (allreduce_fusion.h).
#include "backend/allreduce_fusion.h"

#include <cstdint>

#include "backend/host_buffers.h"
#include "common/hash.h"
#include "common/trace.h"

namespace smdccl {

bool AllreduceFusion::ridersAgree(Comm& c, size_t count) {
  Fnv1a h;  // over each rider's size, dtype and op
  size_t seen = 0;
  queue_.countFusable([&](Fusable& f) {
    if (seen == count) return false;
    auto& q = static_cast<QueuedAllreduce&>(f);
    h.mix(static_cast<uint64_t>(q.tensor.numel()));
    h.mix(static_cast<uint64_t>(q.tensor.scalar_type()));
    h.mix(static_cast<uint64_t>(q.spec.op));
    h.mix(q.device ? 1u : 0u);
    ++seen;
    return true;
  });
  // One round: the minimum of h and of ~h (~ reverses the order) gives the
  // smallest and the largest fingerprint.
  int64_t pair[2] = {static_cast<int64_t>(h.value), ~static_cast<int64_t>(h.value)};
  trace::Span span("fusion: compare the riders", "check", *c.ctx.group);
  recursiveDoublingAllreduce(c, reinterpret_cast<char*>(pair), 2, DType::I64, RedOp::Min);
  return pair[0] == ~pair[1];
}

void AllreduceFusion::run(Comm& c, QueuedAllreduce& first, std::atomic<uint64_t>& runSeq,
                          const Reducers& reduce) {
  auto sameKind = [&](const QueuedAllreduce& q) {
    return q.tensor.scalar_type() == first.tensor.scalar_type() && q.spec.op == first.spec.op &&
           q.spec.preScale == first.spec.preScale && q.spec.postDivide == first.spec.postDivide &&
           !q.spec.preScaleTensor.defined() && (q.device != nullptr) == (first.device != nullptr);
  };
  size_t bytes = first.tensor.nbytes();
  std::vector<at::Tensor> batch{first.tensor};
  // Run inline by a caller (tryRunInline), the progress thread may pop the
  // queue's head between the rounds below and the take: offer nothing then
  // (the rounds still run, so every rank makes the same ones). Inline runs
  // start with nothing queued, so little is lost.
  // Issued by a completion callback (runNested), the op runs ahead of the
  // queue: a rider taken from there would complete inside that callback, so
  // the ops its own callbacks issue would run there on a rank that attached
  // them in time and after the callback on a rank that attached them late.
  const bool mayTake = queue_.onOwnThread() && !queue_.runningNested();
  int32_t count = !mayTake ? 0 : static_cast<int32_t>(queue_.countFusable([&](Fusable& f) {
    auto& q = static_cast<QueuedAllreduce&>(f);
    if (!sameKind(q) || bytes + q.tensor.nbytes() > maxBytes_) return false;
    // A tensor queued twice (or overlapping views) must be reduced twice, in
    // order: the run of fused allreduces ends before it.
    for (const auto& t : batch)
      if (overlaps(t, q.tensor)) return false;
    bytes += q.tensor.nbytes();
    batch.push_back(q.tensor);
    return true;
  }));
  // Queues differ between ranks: fuse what every rank has (one tiny round).
  {
    trace::Span span("fusion: agree on the count", "check", *c.ctx.group);
    recursiveDoublingAllreduce(c, reinterpret_cast<char*>(&count), 1, DType::I32, RedOp::Min);
  }
  // The op headers compare the first allreduce only: the riders' sizes must
  // agree too, or swapped sizes with equal totals would mix tensors silently.
  // On any difference nothing is fused: each runs alone and its own header
  // check names both calls.
  if (count > 0 && !ridersAgree(c, static_cast<size_t>(count))) count = 0;
  auto taken = queue_.takeFusable(static_cast<size_t>(count));
  if (taken.empty()) {  // nothing to fuse: in place, without packing a flat copy
    reduce.one(first);
    return;
  }
  std::vector<at::Tensor> ts{first.tensor};
  std::vector<ReduceSpec> specs{first.spec};
  for (auto& f : taken) {
    auto& q = static_cast<QueuedAllreduce&>(*f);
    uint64_t seq = runSeq.fetch_add(1) + 1;
    q.number->store(seq);  // the same on every rank: they agreed on `count`
    q.work->markStarted();
    riders_.works.push_back(q.work);  // on failure runWork completes them with its error
    ts.push_back(q.tensor);
    specs.push_back(q.spec);
    if (q.device) {
      // CUDA: signalled by runWork after the fused op, also on failure.
      riders_.devices.push_back({q.device, seq});
      // The op's stream waits for the work the rider's caller queued before it.
      q.device->prepare(c.ctx);
    }
  }
  reduce.flat(ts, specs, first.device);
  for (auto& [d, seq] : riders_.devices) d->finishBody(c.ctx);
  // runWork completes the riders, after this op's end.
  fusedOps_ += taken.size() + 1;
  ++fusedCollectives_;
}

}  // namespace smdccl
