// The collectives of SmdcclBackend: argument checks on the caller's thread,
// data movement on the progress thread (see enqueue()).
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <algorithm>
#include <functional>
#include <map>

#include "algorithms/collectives.h"
#include "backend/backend.h"
#include "backend/sparse_allreduce.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "common/hash.h"
#include "common/log.h"
#include "common/trace.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

namespace {

void checkOnePerRank(const std::vector<at::Tensor>& list, int size, const char* op,
                     const char* what) {
  TORCH_CHECK_VALUE(static_cast<int>(list.size()) == size, "smdccl: ", op, ": ", what,
                    " must hold one tensor per rank (", size, "), got ", list.size());
}

void checkOutputList(const std::vector<at::Tensor>& list, const at::Tensor& ref, int size,
                     const char* op, const char* what) {
  checkOnePerRank(list, size, op, what);
  for (size_t i = 0; i < list.size(); ++i)
    checkSameShapeAndType(list[i], ref, op, strCat(what, "[", i, "]"));
}

// all_gather's output list / reduce_scatter's input list, which may be
// uneven (as with NCCL): one tensor per rank, of `ref`'s dtype; this rank's
// own block has `ref`'s element count. Returns their byte blocks.
Blocks checkBlockList(const std::vector<at::Tensor>& list, const at::Tensor& ref, int rank,
                      int size, const char* op, const char* what, const char* refName) {
  checkOnePerRank(list, size, op, what);
  std::vector<size_t> lengths;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string name = strCat(what, "[", i, "]");
    checkTensor(list[i], op, name.c_str());
    TORCH_CHECK_VALUE(list[i].scalar_type() == ref.scalar_type(), "smdccl: ", op, ": ", name,
                      " has dtype ", list[i].scalar_type(), " but the ", refName, " has ",
                      ref.scalar_type());
    lengths.push_back(list[i].nbytes());
  }
  TORCH_CHECK_VALUE(list[static_cast<size_t>(rank)].numel() == ref.numel(), "smdccl: ", op, ": ",
                    what, "[", rank, "] (this rank's block) has ",
                    list[static_cast<size_t>(rank)].numel(), " elements but the ", refName, " has ",
                    ref.numel());
  return Blocks::fromLengths(lengths);
}

// Copies tensors into / out of consecutive blocks of a flat buffer. An empty
// tensor's data_ptr() is null, and memcpy's pointers must never be (even for
// 0 bytes): skip those.
void packInto(char* dst, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (t.nbytes()) std::memcpy(dst, t.data_ptr(), t.nbytes());
    dst += t.nbytes();
  }
}
void unpackFrom(const char* src, std::vector<at::Tensor>& ts) {
  for (auto& t : ts) {
    if (t.nbytes()) std::memcpy(t.data_ptr(), src, t.nbytes());
    src += t.nbytes();
  }
}

// The c10d signatures nest a per-rank tensor list inside one list per
// device of the process (one here): torch passes [tensor_list], with
// tensor_list[r] for rank r. One-tensor lists, one per rank, are that
// layout transposed: named so, with the fix.
void checkOneList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* op,
                  const char* name) {
  if (lists.size() == 1) return;
  bool transposed =
      lists.size() == static_cast<size_t>(size) && size > 1 &&
      std::all_of(lists.begin(), lists.end(), [](const auto& l) { return l.size() == 1; });
  TORCH_CHECK_VALUE(false, "smdccl: ", op, ": expected one ", name, " (torch's layout: [", name,
                    "], ", name, "[r] for rank r), got ", lists.size(), " lists",
                    transposed ? "; they hold one tensor per rank each, which is that layout "
                                 "transposed: pass [[l[0] for l in lists]]"
                               : "");
}

// The coalesced forms of all_gather_into_tensor / reduce_scatter_tensor
// pair tensors by index, each pair laid out as the single call's.
constexpr const char* kGatherIntoTensorLayout =
    "torch's layout: outputs[i] is one tensor of world_size x inputs[i]'s elements, rank r's "
    "inputs[i] at block r (as all_gather_into_tensor), not one tensor per rank";
constexpr const char* kReduceScatterTensorLayout =
    "torch's layout: inputs[i] is one tensor of world_size x outputs[i]'s elements, block r "
    "reduced into rank r's outputs[i] (as reduce_scatter_tensor), not one tensor per rank";

// gather's gather_list / scatter's scatter_list: one tensor per rank on the
// root, nothing elsewhere.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& ref, int rank, int root, int size,
                                 const char* op, const char* name) {
  if (rank != root) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(), "smdccl: ", op, ": only the root (rank ",
                      root, ") passes ", name);
    return {};
  }
  checkOneList(lists, size, op, name);
  checkOutputList(lists[0], ref, size, op, name);
  return lists[0];
}

// all_gather_coalesced's output_tensor_lists in torch's layout (gloo's and
// NCCL's): one list per rank, output_tensor_lists[r][i] receiving rank r's
// input i. Lists given the other way round (one list per input, one tensor
// per rank) are named as such, with the fix: when world_size equals the
// number of inputs and the shapes agree the two cannot be told apart.
void checkPerRankLists(const std::vector<std::vector<at::Tensor>>& lists,
                       const std::vector<at::Tensor>& inputs, int size, const char* op) {
  auto fits = [&](size_t outer, size_t inner, bool transposed) {
    if (lists.size() != outer) return false;
    for (size_t a = 0; a < lists.size(); ++a) {
      if (lists[a].size() != inner) return false;
      for (size_t b = 0; b < lists[a].size(); ++b) {
        const at::Tensor& t = lists[a][b];
        const at::Tensor& in = inputs[transposed ? a : b];
        if (!t.defined() || t.numel() != in.numel() || t.scalar_type() != in.scalar_type())
          return false;
      }
    }
    return true;
  };
  size_t n = inputs.size(), ranks = static_cast<size_t>(size);
  if (fits(ranks, n, /*transposed=*/false)) return;  // each tensor's own checks follow
  const char* layout =
      "torch's layout (gloo's and NCCL's) is one list per rank, output_tensor_lists[r][i] "
      "receiving rank r's input_tensor_list[i]";
  if (fits(n, ranks, /*transposed=*/true))
    TORCH_CHECK_VALUE(false, "smdccl: ", op,
                      ": output_tensor_lists holds one list per input tensor (", n,
                      ") of one tensor per rank (", size, "): the transpose of ", layout,
                      "; pass [list(t) for t in zip(*output_tensor_lists)]");
  TORCH_CHECK_VALUE(lists.size() == ranks, "smdccl: ", op,
                    ": output_tensor_lists must hold one list per rank (", size, "), got ",
                    lists.size(), "; ", layout);
  for (size_t r = 0; r < lists.size(); ++r)
    TORCH_CHECK_VALUE(lists[r].size() == n, "smdccl: ", op, ": output_tensor_lists[", r,
                      "] must hold one tensor per input tensor (", n, "), got ", lists[r].size(),
                      "; ", layout);
}

// Allgathers several inputs as one message (rank r's block is its inputs
// packed); `place(i, r)` says where input i of rank r goes.
void allgatherPacked(Comm& c, const std::vector<at::Tensor>& ins, const Tuning& tuning,
                     const std::function<char*(size_t, int)>& place) {
  size_t each = 0;
  for (auto& t : ins) each += t.nbytes();
  at::Tensor flat = at::empty({static_cast<int64_t>(each * c.size())}, at::kByte);
  packInto(bytesOf(flat) + each * c.rank(), ins);
  smdccl::allgather(c, bytesOf(flat), Blocks::equal(c.size(), each), tuning);
  for (int r = 0; r < c.size(); ++r) {
    const char* src = bytesOf(flat) + each * r;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i].nbytes()) std::memcpy(place(i, r), src, ins[i].nbytes());
      src += ins[i].nbytes();
    }
  }
}

// fp16 on the wire tops out at 65504: a float32 sum whose partial sums pass
// it would arrive as inf. Never hand that back silently: the fp16 pack counts
// finite values it turned into inf on this thread, and the ranks agree (one
// tiny round) on whether any of them did; if so, every rank raises. An inf
// that was in an input is not an overflow and passes through.
class WireOverflowCheck {
 public:
  explicit WireOverflowCheck(Wire wire) : on_(wire == Wire::F16), before_(tlsFp16Overflows) {}
  void finish(Comm& c) {
    if (!on_) return;
    trace::Span span("fp16 overflow check", "check", *c.ctx.group);
    uint8_t overflowed = tlsFp16Overflows != before_ ? 1 : 0;
    recursiveDoublingAllreduce(c, reinterpret_cast<char*>(&overflowed), 1, DType::U8, RedOp::Max);
    TORCH_CHECK_VALUE(!overflowed, "smdccl: ", c.ctx.describe(),
                      ": a float32 sum overflowed the fp16 wire (|partial sum| > 65504) and "
                      "became inf; use SMDCCL_COMPRESSION=bf16 (float32's range), ReduceOp.AVG "
                      "(scaled before the wire), scale the tensor down, or turn compression off");
  }

 private:
  bool on_;
  uint64_t before_;
};

// The signature of a call (what every rank must pass alike) and the inputs
// whose contents it sends. `count`: elements each rank passes, or kAnyCount.
OpCall callOf(std::vector<at::Tensor> inputs, at::ScalarType dt, uint64_t count, int redop = -1,
              int root = -1) {
  OpCall call;
  call.sig.dtype = static_cast<int>(dt);
  call.sig.dtypeName = c10::toString(dt);
  call.sig.redop = redop;
  call.sig.root = root;
  call.sig.count = count;
  if (count != OpSignature::kAnyCount) {
    // Shapes, for the full fingerprint (FNV-1a over every input's sizes).
    Fnv1a h;
    for (const auto& t : inputs) {
      h.mix(static_cast<uint64_t>(t.dim()));
      for (int64_t d : t.sizes()) h.mix(static_cast<uint64_t>(d));
    }
    call.sig.shapeHash = h.value;
  }
  call.inputs = std::move(inputs);
  return call;
}

uint64_t numelOf(const std::vector<at::Tensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += static_cast<uint64_t>(t.numel());
  return n;
}

// The call of an all_gather over the output list / a reduce_scatter over the
// input list `list` (`ref`: the input / output): an even list is described
// by one block's count, an uneven one by the total, fingerprinted (DETAIL)
// by every block's shape, so that ranks that disagree on any block's size
// get a mismatch error.
OpCall blockListCall(const std::vector<at::Tensor>& list, const at::Tensor& ref, int redop = -1) {
  bool even = std::all_of(list.begin(), list.end(),
                          [&](const at::Tensor& t) { return t.numel() == ref.numel(); });
  if (even) return callOf({ref}, ref.scalar_type(), ref.numel(), redop);
  OpCall call = callOf(list, ref.scalar_type(), numelOf(list), redop);
  call.inputs = {ref};
  return call;
}

int redOpCode(const ::c10d::ReduceOp& op) { return static_cast<int>(op.op_); }

// gather's data movement: every rank's `in` into world_size consecutive
// blocks of `out` on the root (nullptr elsewhere). The root's own block is
// copied here unless `in` already is that block (in place).
void gatherInto(Comm& c, const at::Tensor& in, char* out, int root) {
  size_t each = in.nbytes();
  if (c.rank() != root) {
    directGather(c, bytesOf(in), each, nullptr, Blocks(), root);
    return;
  }
  char* mine = out + each * static_cast<size_t>(root);
  if (each && mine != bytesOf(in)) std::memcpy(mine, bytesOf(in), each);
  directGather(c, bytesOf(in), each, out, Blocks::equal(c.size(), each), root);
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto* a0 = bytesOf(a);
  auto* b0 = bytesOf(b);
  return a.nbytes() && b.nbytes() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

// ---------------------------------------------------------------- allreduce

WorkPtr SmdcclBackend::allreduce(std::vector<at::Tensor>& tensors,
                                 const ::c10d::AllreduceOptions& opts) {
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
  // ranks may choose differently for the same call.
  std::shared_ptr<QueuedAllreduce> fusable;
  if (fusionBytes_ > 0 && size_ > 1 && t.nbytes() <= kFusableBytes &&
      !spec.preScaleTensor.defined()) {
    fusable = std::make_shared<QueuedAllreduce>();
    fusable->tensor = t;
    fusable->spec = spec;
    fusable->device = dev;
    return enqueue(
        OpType::ALLREDUCE, "allreduce",
        callOf({t}, t.scalar_type(), t.numel(), redOpCode(opts.reduceOp)), tensors,
        [this, self = fusable](Comm& c) { runFusedAllreduce(c, *self); }, opts.timeout,
        opts.asyncOp, fusable, dev);
  }
  return enqueue(
      OpType::ALLREDUCE, "allreduce",
      callOf({t}, t.scalar_type(), t.numel(), redOpCode(opts.reduceOp)), tensors,
      [this, t, spec, tuning, dev](Comm& c) mutable { allreduceOne(c, t, spec, dev, tuning); },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::allreduceSparse(at::Tensor t, const ::c10d::AllreduceOptions& opts) {
  const char* op = "sparse allreduce";
  TORCH_CHECK_VALUE(t.device().is_cpu(), "smdccl: ", op, ": the tensor is on ", t.device(),
                    "; smdccl reduces sparse tensors on the CPU: pass t.cpu() (or a dense tensor)");
  toDType(t.scalar_type(), op);
  // Entries a rank does not hold are zeros: only SUM and AVG are the same
  // whether those are counted or not (gloo offers SUM alone).
  auto kind = opts.reduceOp.op_;
  TORCH_CHECK_VALUE(kind == ::c10d::ReduceOp::SUM || kind == ::c10d::ReduceOp::AVG, "smdccl: ", op,
                    " supports ReduceOp.SUM and ReduceOp.AVG; for other ops pass a dense "
                    "tensor (t.to_dense())");
  bool average = kind == ::c10d::ReduceOp::AVG;
  if (average) toReduceSpec(opts.reduceOp, t.scalar_type(), size_, op);  // floating point only
  // The entry counts differ between ranks (kAnyCount); the engine checks
  // the shapes itself. The NaN check looks at the values when the op runs
  // (an op queued before this one may replace them), in the body.
  OpCall call = callOf({}, t.scalar_type(), OpSignature::kAnyCount, redOpCode(opts.reduceOp));
  std::vector<at::Tensor> outputs{t};
  return enqueue(
      OpType::ALLREDUCE, "sparse_allreduce", std::move(call), outputs,
      [this, t, average](Comm& c) mutable {
        if (nanCheck_) checkFinite(c, {t._values()});
        sparseAllreduce(c, t, average, tuning_);
      },
      opts.timeout, opts.asyncOp);
}

void SmdcclBackend::allreduceOne(Comm& c, at::Tensor& t, ReduceSpec spec,
                                 const std::shared_ptr<DeviceOp>& dev, const Tuning& tuning) {
  DType dt = toDType(t.scalar_type(), "allreduce");
  WireOverflowCheck overflow(useWire(c, dt, spec));
  applyPreScale(t, spec);
  allreduceOn(dev, c, bytesOf(t), static_cast<size_t>(t.numel()), dt, spec.op, tuning);
  applyPostDivide(t, spec);
  overflow.finish(c);
}

void SmdcclBackend::allreduceFlat(Comm& c, std::vector<at::Tensor>& ts,
                                  std::vector<ReduceSpec>& specs,
                                  const std::shared_ptr<DeviceOp>& dev) {
  DType dt = toDType(ts[0].scalar_type(), "allreduce");
  Wire wire = Wire::F32;
  int64_t total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    wire = useWire(c, dt, specs[i]);
    applyPreScale(ts[i], specs[i]);
    total += ts[i].numel();
  }
  WireOverflowCheck overflow(wire);
  if (!dev) {
    at::Tensor flat = scratch_.take(total, ts[0].scalar_type());
    packInto(bytesOf(flat), ts);
    smdccl::allreduce(c, bytesOf(flat), static_cast<size_t>(total), dt, specs[0].op, tuning_);
    unpackFrom(bytesOf(flat), ts);
  } else {
    // On the device, on the op's stream (the body's current stream): one
    // flat buffer through the IPC / staged GPU allreduce, no host copy.
    at::Tensor flat = at::empty({total}, ts[0].options());
    std::vector<at::Tensor> parts;
    int64_t at = 0;
    for (auto& t : ts) {
      parts.push_back(flat.narrow(0, at, t.numel()));
      at += t.numel();
    }
    for (size_t i = 0; i < ts.size(); ++i) parts[i].copy_(ts[i].reshape({-1}));
    dev->allreduce(c, bytesOf(flat), static_cast<size_t>(total), dt, specs[0].op, tuning_);
    for (size_t i = 0; i < ts.size(); ++i) ts[i].view({-1}).copy_(parts[i]);
  }
  for (size_t i = 0; i < ts.size(); ++i) applyPostDivide(ts[i], specs[i]);
  overflow.finish(c);
}

bool SmdcclBackend::ridersAgree(Comm& c, size_t count) {
  Fnv1a h;  // over each rider's size, dtype and op
  size_t seen = 0;
  progress_->countFusable([&](Fusable& f) {
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

void SmdcclBackend::runFusedAllreduce(Comm& c, QueuedAllreduce& first) {
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
  const bool mayTake = progress_->onOwnThread();
  int32_t count = !mayTake ? 0 : static_cast<int32_t>(progress_->countFusable([&](Fusable& f) {
    auto& q = static_cast<QueuedAllreduce&>(f);
    if (!sameKind(q) || bytes + q.tensor.nbytes() > fusionBytes_) return false;
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
  auto taken = progress_->takeFusable(static_cast<size_t>(count));
  if (taken.empty()) {  // nothing to fuse: in place, without packing a flat copy
    allreduceOne(c, first.tensor, first.spec, first.device, tuning_);
    return;
  }
  std::vector<at::Tensor> ts{first.tensor};
  std::vector<ReduceSpec> specs{first.spec};
  for (auto& f : taken) {
    auto& q = static_cast<QueuedAllreduce&>(*f);
    uint64_t seq = runSeq_.fetch_add(1) + 1;
    q.number->store(seq);  // the same on every rank: they agreed on `count`
    q.work->markStarted();
    riders_.push_back(q.work);  // on failure runWork completes them with its error
    ts.push_back(q.tensor);
    specs.push_back(q.spec);
    if (q.device) {
      // CUDA: signalled by runWork after the fused op, also on failure.
      riderDevices_.push_back({q.device, seq});
      // The op's stream waits for the work the rider's caller queued before it.
      q.device->prepare(c.ctx);
    }
  }
  allreduceFlat(c, ts, specs, first.device);
  for (auto& [d, seq] : riderDevices_) d->finishBody(c.ctx);
  // runWork completes the riders, after this op's end.
  fusedOps_ += taken.size() + 1;
  ++fusedCollectives_;
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
  std::vector<at::Tensor> ts = real;  // CUDA tensors stay on the device (allreduceFlat)
  return enqueue(
      OpType::ALLREDUCE_COALESCED, "allreduce_coalesced",
      callOf(ts, ts[0].scalar_type(), numelOf(ts), redOpCode(opts.reduceOp)), tensors,
      [this, ts, specs, dev](Comm& c) mutable {
        // One flat buffer per dtype: one collective each instead of one per tensor.
        std::map<at::ScalarType, std::vector<size_t>> byType;
        for (size_t i = 0; i < ts.size(); ++i) byType[ts[i].scalar_type()].push_back(i);
        for (auto& [type, idx] : byType) {
          std::vector<at::Tensor> group;
          std::vector<ReduceSpec> groupSpecs;
          for (size_t i : idx) {
            group.push_back(ts[i]);
            groupSpecs.push_back(specs[i]);
          }
          allreduceFlat(c, group, groupSpecs, dev);
        }
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
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
  return enqueue(
      OpType::REDUCE, "reduce",
      callOf({t}, t.scalar_type(), t.numel(), redOpCode(opts.reduceOp),
             static_cast<int>(opts.rootRank)),
      tensors,
      [this, t, spec, dt, isRoot, tuning, dev,
       root = static_cast<int>(opts.rootRank)](Comm& c) mutable {
        // Non-roots reduce a scratch copy: their input stays as it was.
        at::Tensor buf = isRoot ? t : dev ? t.clone() : scratch_.copyOf(t);
        WireOverflowCheck overflow(useWire(c, dt, spec));
        applyPreScale(buf, spec);
        if (dev)  // CUDA tensors: the device path's allreduce
          allreduceOn(dev, c, bytesOf(buf), static_cast<size_t>(buf.numel()), dt, spec.op, tuning);
        else
          smdccl::reduce(c, bytesOf(buf), static_cast<size_t>(buf.numel()), dt, spec.op, root,
                         tuning);
        if (isRoot) applyPostDivide(buf, spec);
        overflow.finish(c);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- broadcast

WorkPtr SmdcclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                 const ::c10d::BroadcastOptions& opts) {
  at::Tensor t = checkSingle(tensors, "broadcast");
  checkRank(opts.rootRank, size_, "broadcast", "root rank");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "smdccl: broadcast: rootTensor must be 0");
  int root = static_cast<int>(opts.rootRank);
  Tuning tuning = tuning_;
  // Only the root's data is sent: only its input is checked for NaN/Inf.
  OpCall call = callOf({t}, t.scalar_type(), t.numel(), -1, root);
  if (root != rank_) call.inputs.clear();
  auto dev = deviceOps_->begin({t}, "broadcast");
  at::Tensor h = hostOf(dev, t, root == rank_, root != rank_);
  return enqueue(
      OpType::BROADCAST, "broadcast", std::move(call), tensors,
      [h, root, tuning](Comm& c) { smdccl::broadcast(c, bytesOf(h), h.nbytes(), root, tuning); },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- allgather

WorkPtr SmdcclBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                 std::vector<at::Tensor>& inputs,
                                 const ::c10d::AllgatherOptions& opts) {
  at::Tensor in = checkSingle(inputs, "allgather");
  checkOneList(outputs, size_, "allgather", "output_tensor_list");
  Blocks blocks =
      checkBlockList(outputs[0], in, rank_, size_, "allgather", "output_tensor_list", "input");
  auto dev = deviceOps_->begin(allOf(outputs[0], {in}), "allgather");
  std::vector<at::Tensor> outs = hostOf(dev, outputs[0], false, true);
  at::Tensor hin = hostOf(dev, in, true, false);
  Tuning tuning = tuning_;
  return enqueue(
      OpType::ALLGATHER, "allgather", blockListCall(outputs[0], in), outputs[0],
      [in = hin, outs, blocks, tuning](Comm& c) mutable {
        at::Tensor flat = at::empty({static_cast<int64_t>(blocks.total())}, at::kByte);
        if (in.nbytes())
          std::memcpy(bytesOf(flat) + blocks.offset[c.rank()], bytesOf(in), in.nbytes());
        smdccl::allgather(c, bytesOf(flat), blocks, tuning);
        unpackFrom(bytesOf(flat), outs);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                       const ::c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor", "input");
  checkTensor(output, "all_gather_into_tensor", "output");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                    "smdccl: all_gather_into_tensor: output dtype ", output.scalar_type(),
                    " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_,
                    "smdccl: all_gather_into_tensor: output must have world_size (", size_,
                    ") x input elements = ", input.numel() * size_, ", got ", output.numel());
  auto dev = deviceOps_->begin({input, output}, "all_gather_into_tensor");
  Tuning tuning = tuning_;
  if (dev)  // on the GPU (CUDA IPC inside a node), no host copies here
    return enqueue(
        OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
        callOf({input}, input.scalar_type(), input.numel()), {output},
        [input, output, tuning, dev](Comm& c) {
          dev->allgather(c, bytesOf(input), bytesOf(output), input.nbytes(), tuning);
        },
        opts.timeout, opts.asyncOp, nullptr, dev);
  return enqueue(
      OpType::_ALLGATHER_BASE, "all_gather_into_tensor",
      callOf({input}, input.scalar_type(), input.numel()), {output},
      [input, output, tuning](Comm& c) {
        size_t each = input.nbytes();
        char* mine = bytesOf(output) + each * c.rank();
        if (each && mine != bytesOf(input)) std::memmove(mine, bytesOf(input), each);
        smdccl::allgather(c, bytesOf(output), Blocks::equal(c.size(), each), tuning);
      },
      opts.timeout, opts.asyncOp);
}

WorkPtr SmdcclBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                           std::vector<at::Tensor>& inputs,
                                           const ::c10d::AllgatherOptions& opts) {
  checkPerRankLists(outputLists, inputs, size_, "allgather_coalesced");
  std::vector<at::Tensor> allOutputs;
  for (size_t r = 0; r < outputLists.size(); ++r) {
    for (size_t i = 0; i < inputs.size(); ++i)
      checkSameShapeAndType(outputLists[r][i], inputs[i], "allgather_coalesced",
                            strCat("output_tensor_lists[", r, "][", i, "]"));
    allOutputs.insert(allOutputs.end(), outputLists[r].begin(), outputLists[r].end());
  }
  for (const auto& in : inputs) checkTensor(in, "allgather_coalesced", "input");
  auto dev = deviceOps_->begin(allOf(allOutputs, inputs), "allgather_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<std::vector<at::Tensor>> outs;
  for (auto& list : outputLists) outs.push_back(hostOf(dev, list, false, true));
  Tuning tuning = tuning_;
  return enqueue(
      OpType::ALLGATHER_COALESCED, "allgather_coalesced",
      callOf(ins, ins.empty() ? at::kByte : ins[0].scalar_type(), numelOf(ins)), allOutputs,
      [ins, outs, tuning](Comm& c) {
        allgatherPacked(c, ins, tuning, [&](size_t i, int r) { return bytesOf(outs[r][i]); });
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "smdccl: allgather_into_tensor_coalesced: ", inputs.size(), " inputs but ",
                    outputs.size(), " outputs; ", kGatherIntoTensorLayout);
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_into_tensor_coalesced", "input");
    checkTensor(outputs[i], "allgather_into_tensor_coalesced", "output");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "smdccl: allgather_into_tensor_coalesced: output ", i,
                      " must have the input's dtype and world_size x its elements; ",
                      kGatherIntoTensorLayout);
  }
  auto dev = deviceOps_->begin(allOf(inputs, outputs), "allgather_into_tensor_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, outputs, false, true);
  Tuning tuning = tuning_;
  return enqueue(
      OpType::COALESCED, "allgather_into_tensor_coalesced",
      callOf(ins, ins.empty() ? at::kByte : ins[0].scalar_type(), numelOf(ins)), outputs,
      [ins, outs, tuning](Comm& c) {
        allgatherPacked(c, ins, tuning,
                        [&](size_t i, int r) { return bytesOf(outs[i]) + ins[i].nbytes() * r; });
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- gather / scatter

WorkPtr SmdcclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) {
  at::Tensor in = checkSingle(inputs, "gather");
  checkRank(opts.rootRank, size_, "gather", "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devOuts =
      rootList(outputs, in, rank_, root, size_, "gather", "gather_list");
  auto dev = deviceOps_->begin(allOf(devOuts, {in}), "gather");
  std::vector<at::Tensor> outs = hostOf(dev, devOuts, false, true);
  at::Tensor hin = hostOf(dev, in, true, false);
  return enqueue(
      OpType::GATHER, "gather", callOf({hin}, in.scalar_type(), in.numel(), -1, root), devOuts,
      [in = hin, outs, root](Comm& c) mutable {
        if (c.rank() != root) return gatherInto(c, in, nullptr, root);
        at::Tensor flat = at::empty({static_cast<int64_t>(in.nbytes() * c.size())}, at::kByte);
        gatherInto(c, in, bytesOf(flat), root);
        unpackFrom(bytesOf(flat), outs);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                          const ::c10d::GatherOptions& opts) {
  const char* op = "gather_into_tensor";
  checkTensor(input, op, "input");
  checkRank(opts.rootRank, size_, op, "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devOuts;
  if (rank_ == root) {
    // torch passes an empty placeholder elsewhere; the root's is checked.
    checkTensor(output, op, "output");
    TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "smdccl: ", op,
                      ": the output has dtype ", output.scalar_type(), " but the input has ",
                      input.scalar_type());
    TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "smdccl: ", op, ": the output has ",
                      output.numel(), " elements; it needs world_size (", size_, ") x the input's ",
                      input.numel());
    TORCH_CHECK_VALUE(
        !overlaps(output, input) || bytesOf(input) == bytesOf(output) + input.nbytes() * root,
        "smdccl: ", op, ": the input overlaps the output other than as the root's own block");
    devOuts.push_back(output);
  }
  auto dev = deviceOps_->begin(allOf(devOuts, {input}), op);
  std::vector<at::Tensor> outs = hostOf(dev, devOuts, false, true);
  at::Tensor hin = hostOf(dev, input, true, false);
  return enqueue(
      OpType::GATHER, op, callOf({hin}, input.scalar_type(), input.numel(), -1, root), devOuts,
      [in = hin, outs, root](Comm& c) mutable {
        gatherInto(c, in, c.rank() == root ? bytesOf(outs[0]) : nullptr, root);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::scatter(std::vector<at::Tensor>& outputs,
                               std::vector<std::vector<at::Tensor>>& inputs,
                               const ::c10d::ScatterOptions& opts) {
  at::Tensor out = checkSingle(outputs, "scatter");
  checkRank(opts.rootRank, size_, "scatter", "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devIns =
      rootList(inputs, out, rank_, root, size_, "scatter", "scatter_list");
  auto dev = deviceOps_->begin(allOf(devIns, {out}), "scatter");
  std::vector<at::Tensor> ins = hostOf(dev, devIns, true, false);
  at::Tensor hout = hostOf(dev, out, false, true);
  // The signature counts the output: only the root passes a scatter_list.
  OpCall call = callOf({hout}, out.scalar_type(), out.numel(), -1, root);
  call.inputs = ins;
  return enqueue(
      OpType::SCATTER, "scatter", std::move(call), outputs,
      [ins, out = hout, root](Comm& c) {
        size_t each = out.nbytes();
        if (c.rank() != root) {
          directScatter(c, nullptr, Blocks(), bytesOf(out), each, root);
          return;
        }
        at::Tensor flat = at::empty({static_cast<int64_t>(each * c.size())}, at::kByte);
        packInto(bytesOf(flat), ins);
        directScatter(c, bytesOf(flat), Blocks::equal(c.size(), each), bytesOf(out), each, root);
        if (each) std::memcpy(bytesOf(out), bytesOf(flat) + each * root, each);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- reduce-scatter

void SmdcclBackend::runReduceScatter(Comm& c, at::Tensor& work, const Blocks& blocks,
                                     at::Tensor& output, const ReduceSpec& given) {
  size_t mine = output.nbytes();
  ReduceSpec spec = given;
  DType dt = toDType(output.scalar_type(), "reduce_scatter");
  WireOverflowCheck overflow(useWire(c, dt, spec));
  applyPreScale(work, spec);
  smdccl::reduceScatter(c, bytesOf(work), blocks, dt, spec.op, tuning_);
  if (mine) std::memcpy(bytesOf(output), bytesOf(work) + blocks.offset[c.rank()], mine);
  applyPostDivide(output, spec);
  overflow.finish(c);
}

bool SmdcclBackend::compressesSomeHop() const {
  Comm c{*mesh_, OpContext{}, ring_, &levels_, /*members: the whole group*/ {}};
  c.wire = cfg_.wire;
  c.wireIntra = cfg_.wireIntra;
  return c.compressesSomeHop(DType::F32);
}

Wire SmdcclBackend::useWire(Comm& c, DType dt, ReduceSpec& spec) const {
  c.wire = cfg_.wire;
  c.wireIntra = cfg_.wireIntra;
  // No compressed hop (one node, compression_intra off): the op is the
  // uncompressed group's, bit for bit (AVG divides after the sum, no fp16
  // overflow round).
  if (!c.compressesSomeHop(dt)) {
    c.wire = Wire::F32;
    return Wire::F32;
  }
  if (spec.postDivide != 1.0) {  // AVG: divide before the wire, where 16 bits must hold it
    spec.preScale = 1.0 / spec.postDivide;
    spec.postDivide = 1.0;
  }
  return c.wire;
}

WorkPtr SmdcclBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                      std::vector<std::vector<at::Tensor>>& inputs,
                                      const ::c10d::ReduceScatterOptions& opts) {
  at::Tensor out = checkSingle(outputs, "reduce_scatter");
  checkOneList(inputs, size_, "reduce_scatter", "input_list");
  Blocks blocks =  // in bytes: the same for complex tensors and their real views
      checkBlockList(inputs[0], out, rank_, size_, "reduce_scatter", "input_list", "output");
  out = realView(out, opts.reduceOp, "reduce_scatter", "output");
  std::vector<at::Tensor> real =
      realViews(inputs[0], opts.reduceOp, "reduce_scatter", "input_list");
  ReduceSpec spec = toReduceSpec(opts.reduceOp, out.scalar_type(), size_, "reduce_scatter");
  auto dev = deviceOps_->begin(allOf(real, {out}), "reduce_scatter");
  std::vector<at::Tensor> ins = hostOf(dev, real, true, false);
  at::Tensor hout = hostOf(dev, out, false, true);
  OpCall call = blockListCall(real, out, redOpCode(opts.reduceOp));
  call.inputs = ins;
  return enqueue(
      OpType::REDUCE_SCATTER, "reduce_scatter", std::move(call), outputs,
      [this, ins, out = hout, blocks, spec](Comm& c) mutable {
        at::Tensor work = scratch_.take(static_cast<int64_t>(numelOf(ins)), out.scalar_type());
        packInto(bytesOf(work), ins);
        runReduceScatter(c, work, blocks, out, spec);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::_reduce_scatter_base(at::Tensor& result, at::Tensor& given,
                                            const ::c10d::ReduceScatterOptions& opts) {
  checkTensor(given, "reduce_scatter_tensor", "input");
  checkTensor(result, "reduce_scatter_tensor", "output");
  TORCH_CHECK_VALUE(result.scalar_type() == given.scalar_type(),
                    "smdccl: reduce_scatter_tensor: output dtype ", result.scalar_type(),
                    " differs from input dtype ", given.scalar_type());
  // The engine works on real views of complex tensors; the caller's output
  // is the work's result.
  at::Tensor input = realView(given, opts.reduceOp, "reduce_scatter_tensor", "input");
  at::Tensor output = realView(result, opts.reduceOp, "reduce_scatter_tensor", "output");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_,
                    "smdccl: reduce_scatter_tensor: input must have world_size (", size_,
                    ") x output elements = ", output.numel() * size_, ", got ", input.numel());
  ReduceSpec spec =
      toReduceSpec(opts.reduceOp, output.scalar_type(), size_, "reduce_scatter_tensor");
  auto dev = deviceOps_->begin({input, output}, "reduce_scatter_tensor");
  OpCall call = callOf({output}, output.scalar_type(), output.numel(), redOpCode(opts.reduceOp));
  call.inputs = {input};
  if (dev) {  // on the GPU (CUDA IPC inside a node), no host copies here
    Tuning tuning = tuning_;
    return enqueue(
        OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", std::move(call), {result},
        [this, input, output, spec, tuning, dev](Comm& c) mutable {
          DType dt = toDType(output.scalar_type(), "reduce_scatter_tensor");
          WireOverflowCheck overflow(useWire(c, dt, spec));
          // The input is left as it was: a pre-scale works on a copy.
          at::Tensor in = input;
          if (spec.needsPreScale()) {
            in = input.clone();
            applyPreScale(in, spec);
          }
          dev->reduceScatter(c, bytesOf(in), bytesOf(output), static_cast<size_t>(output.numel()),
                             dt, spec.op, tuning);
          applyPostDivide(output, spec);
          overflow.finish(c);
        },
        opts.timeout, opts.asyncOp, nullptr, dev);
  }
  return enqueue(
      OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", std::move(call), {result},
      [this, input, output, spec](Comm& c) mutable {
        at::Tensor work = scratch_.copyOf(input);  // the input is left as it was
        runReduceScatter(c, work, Blocks::equal(c.size(), output.nbytes()), output, spec);
      },
      opts.timeout, opts.asyncOp);
}

WorkPtr SmdcclBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "smdccl: reduce_scatter_tensor_coalesced: ", inputs.size(), " inputs but ",
                    outputs.size(), " outputs; ", kReduceScatterTensorLayout);
  std::vector<ReduceSpec> specs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "reduce_scatter_tensor_coalesced", "input");
    checkTensor(outputs[i], "reduce_scatter_tensor_coalesced", "output");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "smdccl: reduce_scatter_tensor_coalesced: input ", i,
                      " must have the output's dtype and world_size x its elements; ",
                      kReduceScatterTensorLayout);
  }
  std::vector<at::Tensor> realIns =
      realViews(inputs, opts.reduceOp, "reduce_scatter_tensor_coalesced", "input");
  std::vector<at::Tensor> realOuts =
      realViews(outputs, opts.reduceOp, "reduce_scatter_tensor_coalesced", "output");
  for (const auto& o : realOuts)
    specs.push_back(
        toReduceSpec(opts.reduceOp, o.scalar_type(), size_, "reduce_scatter_tensor_coalesced"));
  auto dev = deviceOps_->begin(allOf(realIns, realOuts), "reduce_scatter_tensor_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, realIns, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, realOuts, false, true);
  OpCall call = callOf(outs, outs.empty() ? at::kByte : outs[0].scalar_type(), numelOf(outs),
                       redOpCode(opts.reduceOp));
  call.inputs = ins;
  return enqueue(
      OpType::COALESCED, "reduce_scatter_tensor_coalesced", std::move(call), outputs,
      [this, ins, outs, specs](Comm& c) mutable {
        for (size_t i = 0; i < ins.size(); ++i) {
          at::Tensor work = ins[i].clone();
          runReduceScatter(c, work, Blocks::equal(c.size(), outs[i].nbytes()), outs[i], specs[i]);
        }
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- all-to-all

static std::vector<size_t> splitBytes(const std::vector<int64_t>& splits, const at::Tensor& t,
                                      int size, const char* which) {
  int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  size_t rowBytes = rows ? t.nbytes() / rows : 0;
  std::vector<size_t> out;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, "smdccl: all_to_all_single: ", which, " dim 0 (", rows,
                      ") must divide by the world size (", size, ") when no split sizes are given");
    out.assign(size, rowBytes * (rows / size));
    return out;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, "smdccl: all_to_all_single: ", which,
                    " split sizes need one entry per rank (", size, "), got ", splits.size());
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, "smdccl: all_to_all_single: negative split size ", s);
    sum += s;
    out.push_back(rowBytes * static_cast<size_t>(s));
  }
  TORCH_CHECK_VALUE(sum == rows, "smdccl: all_to_all_single: ", which, " split sizes sum to ", sum,
                    " but dim 0 is ", rows);
  return out;
}

WorkPtr SmdcclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                     std::vector<int64_t>& outputSplits,
                                     std::vector<int64_t>& inputSplits,
                                     const ::c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all_single", "input");
  checkTensor(output, "all_to_all_single", "output");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                    "smdccl: all_to_all_single: output dtype ", output.scalar_type(),
                    " differs from input dtype ", input.scalar_type());
  Blocks sendB = Blocks::fromLengths(splitBytes(inputSplits, input, size_, "input"));
  Blocks recvB = Blocks::fromLengths(splitBytes(outputSplits, output, size_, "output"));
  TORCH_CHECK_VALUE(sendB.length[rank_] == recvB.length[rank_],
                    "smdccl: all_to_all_single: this rank (", rank_, ") sends itself ",
                    sendB.length[rank_], " bytes (input_split_sizes[", rank_, "]) but expects ",
                    recvB.length[rank_], " bytes from itself (output_split_sizes[", rank_,
                    "]); the two must match");
  auto dev = deviceOps_->begin({input, output}, "all_to_all_single");
  at::Tensor in = hostOf(dev, input, true, false), out = hostOf(dev, output, false, true);
  // Split sizes may differ between ranks: only the dtype is compared.
  return enqueue(
      OpType::ALLTOALL_BASE, "all_to_all_single",
      callOf({in}, in.scalar_type(), OpSignature::kAnyCount), {output},
      [in, out, sendB, recvB](Comm& c) {
        // Sending from memory that is being received into would corrupt it.
        at::Tensor src = overlaps(in, out) ? in.clone() : in;
        directAlltoall(c, bytesOf(src), sendB, bytesOf(out), recvB);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

WorkPtr SmdcclBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      "smdccl: all_to_all needs one input and one output tensor per rank (", size_, "), got ",
      inputs.size(), " and ", outputs.size());
  std::vector<size_t> sendLen, recvLen;
  for (int r = 0; r < size_; ++r) {
    checkTensor(inputs[r], "all_to_all", "input");
    checkTensor(outputs[r], "all_to_all", "output");
    TORCH_CHECK_VALUE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                          outputs[r].scalar_type() == inputs[0].scalar_type(),
                      "smdccl: all_to_all: all tensors must share one dtype");
    sendLen.push_back(inputs[r].nbytes());
    recvLen.push_back(outputs[r].nbytes());
  }
  TORCH_CHECK_VALUE(sendLen[rank_] == recvLen[rank_], "smdccl: all_to_all: input_tensor_list[",
                    rank_, "] (what this rank sends itself) has ", inputs[rank_].numel(),
                    " elements but output_tensor_list[", rank_, "] has ", outputs[rank_].numel(),
                    "; the two must match");
  auto dev = deviceOps_->begin(allOf(inputs, outputs), "all_to_all");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, outputs, false, true);
  Blocks sendB = Blocks::fromLengths(sendLen), recvB = Blocks::fromLengths(recvLen);
  return enqueue(
      OpType::ALLTOALL, "all_to_all", callOf(ins, ins[0].scalar_type(), OpSignature::kAnyCount),
      outputs,
      [ins, outs, sendB, recvB](Comm& c) mutable {
        at::Tensor in = at::empty({static_cast<int64_t>(sendB.total())}, at::kByte);
        at::Tensor out = at::empty({static_cast<int64_t>(recvB.total())}, at::kByte);
        packInto(bytesOf(in), ins);
        directAlltoall(c, bytesOf(in), sendB, bytesOf(out), recvB);
        unpackFrom(bytesOf(out), outs);
      },
      opts.timeout, opts.asyncOp, nullptr, dev);
}

// ---------------------------------------------------------------- barrier, send/recv

WorkPtr SmdcclBackend::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue(
      OpType::BARRIER, "barrier", OpCall{}, {}, [](Comm& c) { smdccl::barrier(c); }, opts.timeout,
      opts.asyncOp);
}

WorkPtr SmdcclBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  at::Tensor t = checkSingle(tensors, "send");
  checkRank(dstRank, size_, "send", "destination rank");
  TORCH_CHECK_VALUE(dstRank != rank_, "smdccl: send: a rank cannot send to itself");
  auto work = c10::make_intrusive<SmdcclWork>(
      rank_, OpType::SEND, tensors, [dstRank, tag, group = cfg_.groupName] {
        return strCat("send to rank ", dstRank, " tag ", tag, " on group '", group, "'");
      });
  work->markStarted();
  bool onGpu = deviceOps_->deviceOf({t}, "send") >= 0;
  Deadline deadline = Deadline::after(std::chrono::milliseconds(timeoutMs_.load()));
  if (nanCheck_) {
    std::string report = nonFiniteReport(t);
    if (!report.empty()) {
      // The receiver gets this report instead of the data and raises too.
      auto text = std::make_shared<std::string>(strCat("its tensor has ", report));
      std::string msg = strCat("smdccl: send to rank ", dstRank, " (tag ", tag, ") on group '",
                               cfg_.groupName, "': SMDCCL_NAN_CHECK: the tensor has ", report,
                               "; it was not sent (the receive fails too)");
      SMDCCL_WARN(msg);
      p2p_->send(
          dstRank, text->data(), text->size(), tag, deadline,
          [work, text, msg](std::exception_ptr e) {
            work->complete(toTorchError(e ? e : std::make_exception_ptr(InvalidArgument(msg))));
          },
          nullptr, P2PHeader::kNonFinite);
      return work;
    }
  }
  DeviceOps::HostCopy copy{t, nullptr};
  if (onGpu) copy = deviceOps_->hostCopyForSend(t);
  at::Tensor h = copy.host;
  p2p_->send(
      dstRank, h.data_ptr(), h.nbytes(), tag, deadline,
      [work, h](std::exception_ptr e) { work->complete(e ? toTorchError(e) : nullptr); },
      std::move(copy.ready));
  return work;
}

WorkPtr SmdcclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  at::Tensor t = checkSingle(tensors, "recv");
  checkRank(srcRank, size_, "recv", "source rank");
  TORCH_CHECK_VALUE(srcRank != rank_, "smdccl: recv: a rank cannot receive from itself");
  return postRecv(t, srcRank, tag);
}

WorkPtr SmdcclBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  at::Tensor t = checkSingle(tensors, "recv");
  TORCH_CHECK_VALUE(size_ > 1,
                    "smdccl: recv from any source on a group of one rank: there is "
                    "no other rank to receive from");
  return postRecv(t, -1, tag);
}

WorkPtr SmdcclBackend::postRecv(const at::Tensor& t, int srcRank, int tag) {
  std::vector<at::Tensor> tensors{t};
  auto work = c10::make_intrusive<SmdcclWork>(
      rank_, srcRank < 0 ? OpType::RECVANYSOURCE : OpType::RECV, tensors,
      [srcRank, tag, group = cfg_.groupName] {
        return strCat("recv from ",
                      srcRank < 0 ? std::string("any source") : strCat("rank ", srcRank), " tag ",
                      tag, " on group '", group, "'");
      });
  work->markStarted();
  // A receive from a named rank knows its source from the start (gloo code
  // reads _source_rank() of every receive); an any-source one learns it.
  if (srcRank >= 0) work->setSourceRank(srcRank);
  DeviceOps::HostLanding landing{t, nullptr, nullptr};
  if (deviceOps_->deviceOf({t}, "recv") >= 0) landing = deviceOps_->hostForRecv(t);
  if (landing.completion) work->setDeviceCompletion(landing.completion);
  at::Tensor h = landing.host;
  Deadline deadline = Deadline::after(std::chrono::milliseconds(timeoutMs_.load()));
  Completion done = [work, h, land = std::move(landing.land)](std::exception_ptr e) {
    if (land) {
      try {
        land(/*arrived=*/!e);
      } catch (...) {
        if (!e) e = std::current_exception();
      }
    }
    work->complete(e ? toTorchError(e) : nullptr);
  };
  if (srcRank >= 0) p2p_->recv(srcRank, h.data_ptr(), h.nbytes(), tag, deadline, std::move(done));
  else
    p2p_->recvAny(
        h.data_ptr(), h.nbytes(), tag, deadline, [work](int from) { work->setSourceRank(from); },
        std::move(done));
  return work;
}

}  // namespace smdccl
