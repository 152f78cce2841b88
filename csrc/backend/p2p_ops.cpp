// SmdcclBackend's barrier and point-to-point calls (send, recv, recv
// from any source).
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include "algorithms/collectives.h"
#include "backend/backend.h"
#include "backend/gil.h"
#include "common/monitored_barrier.h"
#include "backend/arg_checks.h"
#include "backend/torch_error.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "common/log.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

// ---------------------------------------------------------------- barrier, send/recv

WorkPtr SmdcclBackend::barrier(const ::c10d::BarrierOptions& opts) {
  return enqueue({.type = OpType::BARRIER,
                  .name = "barrier",
                  .body = [](Comm& c) { smdccl::barrier(c); },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp});
}

WorkPtr SmdcclBackend::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  at::Tensor t = checkSingle(tensors, "send");
  checkRank(dstRank, size_, "send", "destination rank");
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
      p2p_->send(dstRank, {.buf = text->data(),
                           .bytes = text->size(),
                           .tag = tag,
                           .deadline = deadline,
                           .done =
                               [work, text, msg](std::exception_ptr e) {
                                 work->complete(toTorchError(
                                     e ? e : std::make_exception_ptr(InvalidArgument(msg))));
                               },
                           .flags = P2PHeader::kNonFinite});
      return work;
    }
  }
  DeviceOps::HostCopy copy{t, nullptr};
  if (onGpu) copy = deviceOps_->hostCopyForSend(t);
  at::Tensor h = copy.host;
  p2p_->send(
      dstRank,
      {.buf = h.data_ptr(),
       .bytes = h.nbytes(),
       .tag = tag,
       .deadline = deadline,
       .done = [work, h](std::exception_ptr e) { work->complete(e ? toTorchError(e) : nullptr); },
       .ready = std::move(copy.ready)});
  return work;
}

WorkPtr SmdcclBackend::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  at::Tensor t = checkSingle(tensors, "recv");
  checkRank(srcRank, size_, "recv", "source rank");
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
  P2PEngine::Incoming into{.buf = h.data_ptr(),
                           .bytes = h.nbytes(),
                           .tag = tag,
                           .deadline = deadline,
                           .done = std::move(done)};
  if (srcRank >= 0) p2p_->recv(srcRank, std::move(into));
  else p2p_->recvAny(std::move(into), [work](int from) { work->setSourceRank(from); });
  return work;
}

void SmdcclBackend::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Also after the group failed or was aborted (when one most wants to know
  // who is where): it needs only the store.
  MonitoredBarrierCall call;
  call.rank = rank_;
  call.size = size_;
  call.seq = ++monitoredBarriers_;
  // torch's unset timeout is -1; a zero one is a deadline already passed
  // (gloo reports at once), not "the group's timeout": that waited forever
  // for a rank that never comes.
  call.timeout = opts.timeout == ::c10d::kUnsetTimeout
                     ? std::chrono::milliseconds(timeoutMs_.load())
                     : std::max(opts.timeout, std::chrono::milliseconds(0));
  call.waitAllRanks = waitAllRanks;
  call.group = cfg_.groupName;
  GilReleasedIfHeld released;  // it waits for other processes
  try {
    // 2 s for the late ranks' watchdogs to answer (they look every 0.5 s),
    // well within verdictGrace.
    smdccl::monitoredBarrier(*store_, call, [this](const std::vector<int>& late) {
      return watchdog_->describeRanks(late, std::chrono::seconds(2));
    });
  } catch (...) { std::rethrow_exception(toTorchError(std::current_exception())); }
}

}  // namespace smdccl
