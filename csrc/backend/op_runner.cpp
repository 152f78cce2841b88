// SmdcclBackend's op runner: enqueue() decides where a call runs (inline,
// from a completion callback, or queued for the progress thread) and
// runWork() runs one op there: its checks, its body, its failure handling
// and the completion of its Work and of the ops fused into it.
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/StreamGuard.h>

#include <optional>

#include "backend/backend.h"
#include "common/exit_fence.h"
#include "backend/arg_checks.h"
#include "backend/torch_error.h"
#include "common/error.h"
#include "common/log.h"
#include "common/trace.h"

namespace smdccl {

c10::intrusive_ptr<::c10d::Work> SmdcclBackend::enqueue(OpRequest r) {
  seq_.fetch_add(1);
  auto op = std::make_shared<QueuedOp>();
  op->number = std::make_shared<std::atomic<uint64_t>>(0);
  auto what = [name = r.name, number = op->number, group = cfg_.groupName] {
    uint64_t n = number->load();
    return n ? strCat(name, " #", n, " on group '", group, "'")
             : strCat(name, " (queued, not started) on group '", group, "'");
  };
  op->work = c10::make_intrusive<SmdcclWork>(rank_, r.type, std::move(r.outputs), what);
  op->work->setRunner(progress_->key());
  op->work->setOutputLists(r.outputsPerList);
  std::shared_ptr<QueuedAllreduce> fusable = std::move(r.fusable);
  if (fusable) {
    fusable->work = op->work;
    fusable->number = op->number;
  }
  op->timeout = effectiveTimeout(r.timeout);
  if (r.device) op->work->setDeviceCompletion(r.device->completion(what, op->timeout));
  r.call.sig.name = r.name;
  // CPU and CUDA tensors may take different paths (allreduce): under the
  // full fingerprint a CPU rank and a CUDA rank of one call do not match.
  if (r.device && r.call.sig.shapeHash)
    r.call.sig.shapeHash = (r.call.sig.shapeHash ^ 1) * 1099511628211ull;
  op->queuedUs = trace::enabled() ? trace::nowUs() : 0;
  // An op on host copies of CUDA tensors, or with steps the host drives, is
  // queued even when blocking: the progress thread drives it, with the
  // group's internal stream current, never the caller's thread.
  const bool asyncOp = r.asyncOp || (r.device && r.device->hostDriven(levels_, r.call.sig));
  op->request = std::move(r);
  c10::intrusive_ptr<SmdcclWork> work = op->work;
  // Issued by a completion callback, on the progress thread itself: DDP's
  // PowerSGD hook all_reduces in its future callbacks and waits for the
  // result there. Queued, the op would wait behind the very task that waits
  // for it, for ever. It runs here, at once, ahead of what is queued: on
  // every rank at the same point of the run order (right after the op whose
  // completion issued it), whatever the caller threads queued meanwhile.
  if (progress_->runningHere()) {
    progress_->runNested([&] { runWork(*op); });
    return work;
  }
  // A blocking call (async_op=False) with nothing ahead of it runs right here.
  if (!asyncOp && progress_->tryRunInline([&] { runWork(*op); })) return work;
  auto task = [this, op] { runWork(*op); };
  // The thread has stopped after a failure: runWork fails the work at once
  // with the group's cause, here.
  if (!progress_->post(task, std::move(fusable))) task();
  return work;
}

void SmdcclBackend::checkFinite(Comm& c, const std::vector<at::Tensor>& inputs) {
  std::string mine;
  for (size_t i = 0; i < inputs.size() && mine.empty(); ++i) {
    std::string report = nonFiniteReport(inputs[i]);
    if (!report.empty()) mine = strCat("input ", i, " has ", report);
  }
  // flags[r] = 1: rank r's inputs are not finite. Every rank takes part, also
  // ranks whose inputs are not sent (a broadcast's non-roots).
  std::vector<uint8_t> flags(static_cast<size_t>(c.size()), 0);
  flags[static_cast<size_t>(c.rank())] = mine.empty() ? 0 : 1;
  recursiveDoublingAllreduce(c, reinterpret_cast<char*>(flags.data()), flags.size(), DType::U8,
                             RedOp::Max);
  std::string who;
  for (int r = 0; r < c.size(); ++r)
    if (flags[static_cast<size_t>(r)]) who += strCat(who.empty() ? "" : ", ", r);
  if (who.empty()) return;
  std::string msg = strCat("smdccl: ", c.ctx.describe(), ": SMDCCL_NAN_CHECK: NaN or Inf in the ",
                           "input of rank(s) ", who);
  if (!mine.empty()) msg += strCat("; on this rank ", mine);
  SMDCCL_WARN(msg);
  throw InvalidArgument(msg + ". The collective did not run.");
}

void SmdcclBackend::runWork(QueuedOp& op) {
  const char* name = op.request.name;
  DeviceOp* device = op.request.device.get();
  const uint64_t seq = ++runSeq_;
  op.number->store(seq);
  // CUDA: tensor ops of the body (scaling, copies) run on the internal
  // stream, and the work's future completes there.
  std::optional<c10::StreamGuard> onStream;
  if (device) onStream.emplace(device->stream());
  if (std::exception_ptr err = fate_.fatal()) {
    // Streams between ranks are out of step after a failure: fail fast.
    if (device) device->signal(seq);
    op.work->complete(err);
    return;
  }
  op.work->markStarted();
  watchdog_->opStarted(seq, name);
  fusion_->clearRiders();
  OpContext ctx = contextOf(op, seq);
  Comm c{*mesh_, ctx, ring_, &levels_, /*members: the whole group*/ {}};
  c.book = &exchangeBook_;
  const std::string& track = cfg_.groupName;
  if (op.queuedUs) {
    int64_t now = trace::nowUs();
    trace::record({.name = strCat(name, " #", seq, " queued"),
                   .category = "queue",
                   .track = &track,
                   .startUs = op.queuedUs,
                   .durUs = now - op.queuedUs});
  }
  const bool tracing = trace::enabled();
  trace::Span span(tracing ? strCat(name, " #", seq) : std::string(), "collective", track,
                   tracing ? strCat("\"seq\":", seq, ",\"call\":\"",
                                    op.request.call.sig.describe(), "\"")
                           : std::string());
  const bool timing = logEnabled(LogLevel::Trace);
  auto started =
      timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  std::exception_ptr err = runChecksAndBody(op, c);
  watchdog_->opFinished(seq);
  if (timing)
    SMDCCL_TRACE(ctx.describe(), " ", op.request.call.sig.describe(), ": ",
                 std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - started)
                     .count(),
                 " us",
                 fusion_->riderCount() ? strCat(" (", fusion_->riderCount(), " fused in)") : "",
                 err ? " (failed)" : "");
  completeWithRiders(op, seq, err);
}

OpContext SmdcclBackend::contextOf(const QueuedOp& op, uint64_t seq) const {
  OpContext ctx;
  ctx.opName = op.request.name;
  ctx.group = &cfg_.groupName;
  ctx.rank = rank_;
  ctx.seq = seq;
  ctx.deadline = Deadline::after(op.timeout);
  ctx.wait = waitPolicy_;
  ctx.sig = op.request.call.sig;
  ctx.compareShapes = detailChecks_;
  ctx.cancel = mesh_->cancelFlag();
  return ctx;
}

std::exception_ptr SmdcclBackend::runChecksAndBody(QueuedOp& op, Comm& c) {
  const OpCall& call = op.request.call;
  DeviceOp* device = op.request.device.get();
  const OpContext& ctx = c.ctx;
  const std::string& track = cfg_.groupName;
  // A collective writes its results into the caller's tensors as NCCL's
  // kernels do, below autograd: an nn.Parameter (a leaf that requires grad)
  // may be its output whatever the thread's grad mode (the progress
  // thread's is on), and in-place scaling or copies there are legal.
  at::AutoDispatchBelowADInplaceOrView belowAutograd;
  try {
    if (device) device->prepare(ctx);
    // The NaN check reads the inputs: host copies must have landed first.
    if (device && nanCheck_ && call.sig.dtype >= 0) device->awaitInputs(ctx);
    if (detailChecks_) {
      trace::Span phase("fingerprint (DETAIL)", "check", track);
      // Full fingerprint: an empty direct allgather puts this op's header
      // on every link, so every rank compares its call with every other's.
      directAllgather(c, nullptr, Blocks::fromLengths(std::vector<size_t>(size_, 0)));
    }
    if (nanCheck_ && call.sig.dtype >= 0) {
      trace::Span phase("NaN/Inf check", "check", track);
      checkFinite(c, call.inputs);
    }
    if (device) device->beforeBody(ctx);
    op.request.body(c);
    if (device) device->finishBody(ctx);
    return nullptr;
  } catch (const InvalidArgument&) {  // the ranks agreed on it (the NaN check): the group goes on
    return toTorchError(std::current_exception());
  } catch (const c10::ValueError&) {  // likewise (the fp16 overflow check)
    return toTorchError(std::current_exception());
  } catch (const CommError& e) {
    return failGroup(ctx, e.kind(), e.what());
  } catch (const c10::Error& e) {
    // This rank alone (out of memory, ...): its peers would wait for it
    // until their deadline. Failing the group tells them at once.
    return failGroup(ctx, CommError::Kind::System, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return failGroup(ctx, CommError::Kind::System, e.what());
  } catch (...) {
    return failGroup(ctx, CommError::Kind::System, "an exception of unknown type");
  }
}

void SmdcclBackend::completeWithRiders(QueuedOp& op, uint64_t seq, std::exception_ptr err) {
  // Allreduces fused into this one complete with its outcome, after it: in
  // issue order, so that ops their callbacks run right here (enqueue) come
  // in the same order on every rank, whether a rank's callbacks were attached
  // before completion (run here) or after (run by the caller, queued).
  // Moved out first: those ops run runWork again.
  AllreduceFusion::Riders riders = fusion_->takeRiders();
  if (DeviceOp* device = op.request.device.get()) device->signal(seq);
  for (auto& [d, riderSeq] : riders.devices) d->signal(riderSeq);
  riders.devices.clear();
  op.work->complete(err);
  for (auto& w : riders.works) w->complete(err);
  dropOrLeak(riders.works);
}

}  // namespace smdccl
