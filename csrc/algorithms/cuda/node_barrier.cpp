#include "algorithms/cuda/node_barrier.h"

#include <chrono>

#include "common/error.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {
using Clock = std::chrono::steady_clock;
// How often the watch looks at the queued barriers: a timeout is found
// this much late at most. After a failure it releases this often.
constexpr auto kWatchEvery = std::chrono::milliseconds(20);
constexpr auto kReleaseEvery = std::chrono::milliseconds(1);
}  // namespace

std::unique_ptr<GpuNodeBarrier> GpuNodeBarrier::make(KVStore& store, const Spec& s,
                                                     Deadline deadline) {
  SMDCCL_CUDA_CHECK(cudaSetDevice(s.device));
  auto flags = std::make_unique<NodeFlags>(
      store,
      NodeFlags::Spec{
          .keyPrefix = s.keyPrefix,
          .localRank = s.localRank,
          .localSize = static_cast<int>(s.groupRanks.size()),
          .attach = [](char* base, size_t bytes) { return attachStreamFlags(base, bytes); }},
      deadline);
  if (!flags->usable()) {
    // A rank whose own attach worked undoes it; one that failed has nothing to undo.
    if (flags->base()) undoStreamFlags(flags->base());
    SMDCCL_INFO(
        "CUDA IPC steps meet at host barriers: the node's stream barriers are "
        "unavailable (",
        flags->why(), ")");
    return nullptr;
  }
  return std::unique_ptr<GpuNodeBarrier>(new GpuNodeBarrier(s, std::move(flags)));
}

GpuNodeBarrier::GpuNodeBarrier(const Spec& s, std::unique_ptr<NodeFlags> flags)
    : spec_(s),
      flags_(std::move(flags)),
      barrier_(flags_->matrix(), s.localRank),
      queue_(s.stream, flags_->base()),
      thread_([this] { watch(); }) {}

GpuNodeBarrier::~GpuNodeBarrier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  CaptureSafeScope captureSafe;
  const auto start = Clock::now();
  bool released = false;
  for (;;) {
    cudaError_t e = queried(cudaStreamQuery(spec_.stream));
    if (e != cudaErrorNotReady) break;
    if (failure_->failed() || Clock::now() - start > kDrainWait) {
      if (!released)
        SMDCCL_WARN(
            "smdccl: a node-mate never reached this rank's last CUDA IPC barriers "
            "within ",
            kDrainWait.count(),
            " s of the group's end: letting the stream "
            "pass them");
      released = true;
      barrier_.release();
    }
    if (Clock::now() - start > 2 * kDrainWait) {
      // The GPU may still read the flags: leave them mapped (a leak, not a crash).
      SMDCCL_WARN("smdccl: the group's CUDA stream did not drain; its barrier flags stay mapped");
      return;
    }
    std::this_thread::sleep_for(kReleaseEvery);
  }
  undoStreamFlags(flags_->base());
}

void GpuNodeBarrier::arrive(const OpContext& ctx, const char* what) {
  const uint32_t e = barrier_.arrive(queue_);
  pending_.add({e, ctx.deadline, [ctx, what] { return strCat(ctx.describe(), " (", what, ")"); }});
}

bool BarrierFailure::record(const std::string& msg, uint32_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  if (failed_.load()) return false;
  epoch_ = epoch;
  error_ = std::make_exception_ptr(CommError(CommError::Kind::Timeout, msg));
  failed_.store(true, std::memory_order_release);
  return true;
}

std::exception_ptr BarrierFailure::of(uint32_t from, uint32_t upTo) const {
  if (!failed() || from == upTo) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return flagReached(upTo, epoch_) ? error_ : nullptr;
}

void GpuNodeBarrier::onFailure(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(handlerMu_);
  handler_ = std::move(handler);
}

void GpuNodeBarrier::abort(const std::string& cause) {
  uint32_t oldest = 0;
  if (!pending_.oldest(barrier_, &oldest)) oldest = barrier_.lastEpoch() + 1;
  if (failure_->record(cause, oldest)) barrier_.giveUp(oldest);
  cv_.notify_all();
}

void GpuNodeBarrier::watch() {
  markOwnThread();
  cudaSetDevice(spec_.device);
  CaptureSafeScope captureSafe;
  auto groupRank = [this](int local) { return spec_.groupRanks[static_cast<size_t>(local)]; };
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, failure_->failed() ? kReleaseEvery : kWatchEvery);
    if (stop_) break;
    if (failure_->failed()) {
      // A node-mate's late arrival overwrites its slot: release again until
      // this rank's stream is past every barrier it queued.
      if (queried(cudaStreamQuery(spec_.stream)) == cudaErrorNotReady) barrier_.release();
      continue;
    }
    lock.unlock();
    uint32_t epoch = 0;
    std::string msg = pending_.check(barrier_, groupRank, &epoch);
    if (!msg.empty() && failure_->record(msg, epoch)) {
      barrier_.giveUp(epoch);  // first: the node hears of it before the release below
      SMDCCL_WARN(msg);
      // Under its own lock: onFailure(nullptr) waits for a call in progress.
      std::lock_guard<std::mutex> hl(handlerMu_);
      if (handler_) handler_(msg);
    }
    lock.lock();
  }
}

}  // namespace smdccl
