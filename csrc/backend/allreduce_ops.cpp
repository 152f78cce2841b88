// SmdcclBackend's reducing collectives: allreduce (dense, sparse,
// coalesced, fused) and reduce. Checks on the caller's thread; on the
// progress thread (see enqueue()) the body scales around the reduction
// (ReduceSemantics says where) and hands the data to the algorithms
// (collectives.h) or the GPU paths (DeviceOp).
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <map>
#include <numeric>
#include <utility>

#include "algorithms/collectives.h"
#include "backend/backend.h"
#include "backend/call_checks.h"
#include "backend/host_buffers.h"
#include "backend/sparse_allreduce.h"
#include "backend/arg_checks.h"
#include "backend/reduce_scaling.h"
#include "backend/reduce_semantics.h"
#include "backend/scratch_pool.h"
#include "backend/wire_overflow_check.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "common/trace.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

// ---------------------------------------------------------------- allreduce

namespace {

// An allreduce's body on the progress thread, for c: the group's reduction
// rules, tuning and host scratch.
struct AllreduceBody {
  const ReduceSemantics& sem;
  Comm& c;
  const Tuning& tuning;
  ScratchPool& scratch;

  // One allreduce of t in place (on the op's device, or the host):
  // pre-scale, reduce, post-divide, fp16 overflow check.
  void one(at::Tensor& t, ReduceSpec spec, const std::shared_ptr<DeviceOp>& dev) const {
    DType dt = toDType(t.scalar_type(), "allreduce");
    if (sem.int8Widens(c, dt, spec)) {
      // A 16-bit tensor on the int8 wire: summed as float32 (in a scratch
      // copy), rounded to its dtype once at the end.
      at::Tensor wide = sem.widened({t})[0];
      one(wide, spec, dev);
      t.copy_(wide.view(t.sizes()));
      return;
    }
    WireOverflowCheck overflow(sem.useWire(c, dt, spec));
    applyPreScale(t, spec);
    const CollectiveArgs args{
        .buf = bytesOf(t), .count = static_cast<size_t>(t.numel()), .dt = dt, .op = spec.op};
    if (dev) dev->allreduce(c, args, tuning);  // the GPU paths
    else smdccl::allreduce(c, args, tuning);
    applyPostDivide(t, spec);
    overflow.finish(c);
  }

  // One allreduce over `ts` packed flat (same dtype and op): on the host, or
  // on `dev`'s device for CUDA tensors.
  void flat(std::vector<at::Tensor>& ts, std::vector<ReduceSpec>& specs,
            const std::shared_ptr<DeviceOp>& dev) const {
    DType dt = toDType(ts[0].scalar_type(), "allreduce");
    if (sem.int8Widens(c, dt, specs[0])) {  // as one()
      std::vector<at::Tensor> parts = sem.widened(ts);
      flat(parts, specs, dev);
      for (size_t i = 0; i < ts.size(); ++i) ts[i].view({-1}).copy_(parts[i]);
      return;
    }
    Wire wire = Wire::F32;
    std::vector<int64_t> numels;
    for (size_t i = 0; i < ts.size(); ++i) {
      wire = sem.useWire(c, dt, specs[i]);
      applyPreScale(ts[i], specs[i]);
      numels.push_back(ts[i].numel());
    }
    WireOverflowCheck overflow(wire);
    const int64_t total = std::accumulate(numels.begin(), numels.end(), int64_t{0});
    auto argsOf = [&](const at::Tensor& buf) {
      return CollectiveArgs{
          .buf = bytesOf(buf), .count = static_cast<size_t>(total), .dt = dt, .op = specs[0].op};
    };
    if (!dev) {
      at::Tensor buf = scratch.take(total, ts[0].scalar_type());
      packInto(bytesOf(buf), ts);
      smdccl::allreduce(c, argsOf(buf), tuning);
      unpackFrom(bytesOf(buf), ts);
    } else {
      // On the device, on the op's stream (the body's current stream): one
      // flat buffer through the GPU allreduce, no host copy.
      at::Tensor buf = at::empty({total}, ts[0].options());
      std::vector<at::Tensor> parts = buf.split_with_sizes(numels);
      for (size_t i = 0; i < ts.size(); ++i) parts[i].copy_(ts[i].reshape({-1}));
      dev->allreduce(c, argsOf(buf), tuning);
      for (size_t i = 0; i < ts.size(); ++i) ts[i].view({-1}).copy_(parts[i]);
    }
    for (size_t i = 0; i < ts.size(); ++i) applyPostDivide(ts[i], specs[i]);
    overflow.finish(c);
  }
};

}  // namespace

thread_local int64_t SmdcclBackend::feedbackNext_ = -1;

void SmdcclBackend::int8FeedbackDrop(int64_t key) {
  if (!cfg_.int8) return;  // no residuals to end
  std::lock_guard<std::mutex> lock(droppedMu_);
  droppedKeys_.push_back(key);
}

Int8Feedback SmdcclBackend::int8FeedbackFor(int64_t key) {
  if (!cfg_.int8) return {};  // every op of every group asks: nothing to drop or keep
  {
    std::lock_guard<std::mutex> lock(droppedMu_);
    for (int64_t k : droppedKeys_) {
      int8Residuals_.erase(k);
      retiredKeys_.insert(k);
    }
    droppedKeys_.clear();
  }
  Int8Feedback f;
  if (key >= 0 && !retiredKeys_.count(key)) f = {&int8Residuals_[key]};
  int8Keys_.store(int8Residuals_.size(), std::memory_order_release);
  return f;
}

WorkPtr SmdcclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                 const ::c10d::AllreduceOptions& opts) {
  // Taken first: a call that fails its checks must not leave it to the next op.
  const int64_t feedbackKey = std::exchange(feedbackNext_, -1);
  if (tensors.size() == 1 && tensors[0].defined() && tensors[0].layout() == at::kSparse)
    return allreduceSparse(tensors[0], opts);
  at::Tensor t = realView(checkSingle(tensors, "allreduce"), opts.reduceOp, "allreduce", "tensor");
  ReduceSpec spec = toReduceSpec(opts.reduceOp, t.scalar_type(), size_, "allreduce");
  toDType(t.scalar_type(), "allreduce");  // an unsupported dtype raises here, at the call
  Tuning tuning = tuning_;
  auto dev = deviceOps_->begin({t}, "allreduce");
  // Small allreduces may be fused with those queued right behind them. The
  // choice must be the same on every rank (a fusable op opens with a round
  // that agrees on the count), so it does not depend on async_op, which
  // ranks may choose differently for the same call. Either way the op runs
  // with the group's tuning as it was at the call.
  std::shared_ptr<QueuedAllreduce> fusable;
  std::function<void(Comm&)> body;
  if (feedbackKey < 0 && fusion_->fusable(t, spec, size_)) {
    fusable = std::make_shared<QueuedAllreduce>();
    fusable->tensor = t;
    fusable->spec = spec;
    fusable->device = dev;
    body = [this, self = fusable, tuning](Comm& c) {
      fusion_->run(c, *self, runSeq_,
                   {.one =
                        [&](QueuedAllreduce& q) {
                          AllreduceBody{reduce_, c, tuning, scratch_}.one(q.tensor, q.spec,
                                                                          q.device);
                        },
                    .flat =
                        [&](std::vector<at::Tensor>& ts, std::vector<ReduceSpec>& specs,
                            const std::shared_ptr<DeviceOp>& d) {
                          AllreduceBody{reduce_, c, tuning, scratch_}.flat(ts, specs, d);
                        }});
    };
  } else {
    body = [this, t, spec, tuning, dev, feedbackKey](Comm& c) mutable {
      c.int8Feedback = int8FeedbackFor(feedbackKey);
      if (c.int8Feedback) c.int8Feedback.residuals->fit(static_cast<size_t>(t.numel()), true);
      AllreduceBody{reduce_, c, tuning, scratch_}.one(t, spec, dev);
    };
  }
  return enqueue({.type = OpType::ALLREDUCE,
                  .name = "allreduce",
                  .call = callOf({t}, t.scalar_type(), t.numel(), redOpCode(opts.reduceOp)),
                  .outputs = tensors,
                  .body = std::move(body),
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .fusable = fusable,
                  .device = dev});
}

WorkPtr SmdcclBackend::allreduceSparse(at::Tensor t, const ::c10d::AllreduceOptions& opts) {
  const char* opName = "sparse allreduce";
  TORCH_CHECK_VALUE(t.device().is_cpu(), "smdccl: ", opName, ": the tensor is on ", t.device(),
                    "; smdccl reduces sparse tensors on the CPU: pass t.cpu() (or a dense tensor)");
  toDType(t.scalar_type(), opName);
  // Entries a rank does not hold are zeros: only SUM and AVG are the same
  // whether those are counted or not (gloo offers SUM alone).
  auto kind = opts.reduceOp.op_;
  TORCH_CHECK_VALUE(kind == ::c10d::ReduceOp::SUM || kind == ::c10d::ReduceOp::AVG,
                    "smdccl: ", opName,
                    " supports ReduceOp.SUM and ReduceOp.AVG; for other ops pass a dense "
                    "tensor (t.to_dense())");
  bool average = kind == ::c10d::ReduceOp::AVG;
  if (average) toReduceSpec(opts.reduceOp, t.scalar_type(), size_, opName);  // floating point only
  // The entry counts differ between ranks (kAnyCount); the engine checks
  // the shapes itself. The NaN check looks at the values when the op runs
  // (an op queued before this one may replace them), in the body.
  OpCall call = callOf({}, t.scalar_type(), OpSignature::kAnyCount, redOpCode(opts.reduceOp));
  std::vector<at::Tensor> outputs{t};
  return enqueue({.type = OpType::ALLREDUCE,
                  .name = "sparse_allreduce",
                  .call = std::move(call),
                  .outputs = outputs,
                  .body =
                      [this, t, average](Comm& c) mutable {
                        if (nanCheck_) checkFinite(c, {t._values()});
                        sparseAllreduce(c, t, average, tuning_);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp});
}

WorkPtr SmdcclBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                           const ::c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "smdccl: allreduce_coalesced needs at least one tensor");
  std::vector<at::Tensor> real = realViews(tensors, opts.reduceOp, "allreduce_coalesced", "tensor");
  std::vector<ReduceSpec> specs;
  for (auto& t : real) {
    checkTensor(t, "allreduce_coalesced", "tensor");
    specs.push_back(toReduceSpec(opts.reduceOp, t.scalar_type(), size_, "allreduce_coalesced"));
  }
  auto dev = deviceOps_->begin(real, "allreduce_coalesced");
  std::vector<at::Tensor> ts = real;  // CUDA tensors stay on the device (AllreduceBody::flat)
  return enqueue({.type = OpType::ALLREDUCE_COALESCED,
                  .name = "allreduce_coalesced",
                  .call = callOf(ts, ts[0].scalar_type(), numelOf(ts), redOpCode(opts.reduceOp)),
                  .outputs = tensors,
                  .body =
                      [this, ts, specs, dev, tuning = tuning_](Comm& c) mutable {
                        // One flat buffer per dtype: one collective each instead of one per tensor.
                        std::map<at::ScalarType, std::vector<size_t>> byType;
                        for (size_t i = 0; i < ts.size(); ++i)
                          byType[ts[i].scalar_type()].push_back(i);
                        for (auto& [type, idx] : byType) {
                          std::vector<at::Tensor> group;
                          std::vector<ReduceSpec> groupSpecs;
                          for (size_t i : idx) {
                            group.push_back(ts[i]);
                            groupSpecs.push_back(specs[i]);
                          }
                          AllreduceBody{reduce_, c, tuning, scratch_}.flat(group, groupSpecs, dev);
                        }
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::reduce(std::vector<at::Tensor>& tensors, const ::c10d::ReduceOptions& opts) {
  at::Tensor t = realView(checkSingle(tensors, "reduce"), opts.reduceOp, "reduce", "tensor");
  checkRank(opts.rootRank, size_, "reduce", "root rank");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "smdccl: reduce: rootTensor must be 0");
  ReduceSpec spec = toReduceSpec(opts.reduceOp, t.scalar_type(), size_, "reduce");
  DType dt = toDType(t.scalar_type(), "reduce");
  bool isRoot = opts.rootRank == rank_;
  Tuning tuning = tuning_;
  auto dev = deviceOps_->begin({t}, "reduce");
  return enqueue({.type = OpType::REDUCE,
                  .name = "reduce",
                  .call = callOf({t}, t.scalar_type(), t.numel(), redOpCode(opts.reduceOp),
                                 static_cast<int>(opts.rootRank)),
                  .outputs = tensors,
                  .body =
                      [this, t, spec, dt, isRoot, tuning, dev,
                       root = static_cast<int>(opts.rootRank)](Comm& c) mutable {
                        // Non-roots reduce a scratch copy: their input stays as it was.
                        at::Tensor buf = isRoot ? t : dev ? t.clone() : scratch_.copyOf(t);
                        WireOverflowCheck overflow(reduce_.useWire(c, dt, spec));
                        applyPreScale(buf, spec);
                        const CollectiveArgs args{.buf = bytesOf(buf),
                                                  .count = static_cast<size_t>(buf.numel()),
                                                  .dt = dt,
                                                  .op = spec.op,
                                                  .root = root};
                        if (dev) dev->reduce(c, args, tuning);
                        else smdccl::reduce(c, args, tuning);
                        if (isRoot) applyPostDivide(buf, spec);
                        overflow.finish(c);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

}  // namespace smdccl
