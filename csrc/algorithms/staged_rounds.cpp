#include "algorithms/staged_rounds.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "common/error.h"

namespace smdccl {

namespace {

// Waits until `ready()` (polled, backing off to short sleeps), or throws a
// CommError at ctx's deadline or when its group is aborted.
void waitForDevice(const OpContext& ctx, const std::function<bool()>& ready, const char* what) {
  for (int polls = 0; !ready(); ++polls) {
    if (ctx.cancel && ctx.cancel->load(std::memory_order_relaxed))
      throw CommError(CommError::Kind::System,
                      strCat("smdccl: ", ctx.describe(), ": the group was aborted on this rank"));
    if (ctx.deadline.expired())
      throw CommError(
          CommError::Kind::Timeout,
          strCat("smdccl: ", ctx.describe(), " timed out waiting for the device (", what, ")"));
    // A copy takes tens of microseconds or more: spin briefly, then nap.
    if (polls < 100) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

class StagedRounds {
 public:
  StagedRounds(const OpContext& ctx, StageDevice& d, StagedRoundsJob job, char* slots)
      : ctx_(ctx), d_(d), job_(std::move(job)), slots_(slots) {
    SMDCCL_CHECK_ARG(job_.slots >= 1, "staged rounds: need at least one slot");
    // Every range fits its slot: checked before anything moves.
    const size_t es = elementSize(job_.dt);
    for (const StagedRound& r : job_.rounds)
      for (const auto* ranges : {&r.out, &r.in})
        for (const StagedRange& x : *ranges) {
          SMDCCL_CHECK_ARG(x.bytes % es == 0, "staged rounds: a range of part of an element");
          SMDCCL_CHECK_ARG(!x.int8 || job_.dt == DType::F32, "staged rounds: int8 of non-float32");
          SMDCCL_CHECK_ARG(
              x.slotOffset + StageDevice::slotBytes(x.bytes / es, how(x)) <= job_.slotBytes,
              "staged rounds: a range ends past its slot");
        }
    out_.resize(job_.rounds.size());
    in_.resize(job_.rounds.size());
  }

  void run() {
    try {
      const size_t rounds = job_.rounds.size();
      for (size_t k = 0; k < rounds; ++k) {
        waitForDevice(
            ctx_,
            [&] {
              // Round k's copies out are queued only once its slot is free
              // (the round before it there is back); until then the slot
              // holds that round's data, whatever out_[k] (empty) says.
              startCopiesOut();
              return nextOut_ > k && allDone(out_[k]);
            },
            "copy to host memory");
        if (job_.rounds[k].host) job_.rounds[k].host(slotOf(k));
        hostRan_ = k + 1;
        queue(k, /*out=*/false);
      }
      // The slots are free for the next op once the last copies back ran.
      waitForDevice(
          ctx_,
          [&] {
            for (size_t k = rounds > static_cast<size_t>(job_.slots) ? rounds - job_.slots : 0;
                 k < rounds; ++k)
              if (!allDone(in_[k])) return false;
            return true;
          },
          "copy back from host memory");
    } catch (...) {
      d_.abandon();
      throw;
    }
  }

 private:
  StageDevice::Unpack how(const StagedRange& r) const {
    if (r.int8) return {.dt = job_.dt, .int8 = true};
    return {.dt = job_.dt, .wire = StageDevice::packed(job_.dt, job_.wire) ? job_.wire : Wire::F32};
  }
  // Queues round k's copies out (or back).
  void queue(size_t k, bool out) {
    char* slot = slotOf(k);
    const size_t es = elementSize(job_.dt);
    for (const StagedRange& r : out ? job_.rounds[k].out : job_.rounds[k].in) {
      const size_t count = r.bytes / es;
      if (count == 0) continue;
      char* at = slot + r.slotOffset;
      if (out) out_[k].push_back(d_.toHost(at, r.dev, count, how(r)));
      else in_[k].push_back(d_.fromHost(r.dev, at, count, how(r)));
    }
  }
  char* slotOf(size_t k) const {
    return slots_ + (k % static_cast<size_t>(job_.slots)) * job_.slotBytes;
  }
  bool allDone(const std::vector<StageDevice::Ticket>& ts) {
    for (StageDevice::Ticket t : ts)
      if (!d_.done(t)) return false;
    return true;
  }
  // Queues the copies out of every round whose slot is free: the round
  // before it in that slot has run its host step and its copies back.
  void startCopiesOut() {
    const size_t slots = static_cast<size_t>(job_.slots);
    while (nextOut_ < out_.size() &&
           (nextOut_ < slots || (hostRan_ > nextOut_ - slots && allDone(in_[nextOut_ - slots])))) {
      queue(nextOut_, /*out=*/true);
      ++nextOut_;
    }
  }

  const OpContext& ctx_;
  StageDevice& d_;
  StagedRoundsJob job_;
  char* slots_;
  std::vector<std::vector<StageDevice::Ticket>> out_, in_;
  size_t nextOut_ = 0;
  size_t hostRan_ = 0;  // rounds whose host step has run
};

}  // namespace

bool StagedRoundsJob::hasInt8() const {
  for (const StagedRound& r : rounds)
    for (const auto* ranges : {&r.out, &r.in})
      for (const StagedRange& x : *ranges)
        if (x.int8) return true;
  return false;
}

void runStagedRounds(const OpContext& ctx, StageDevice& device, StagedRoundsJob job, char* slots) {
  if (!job.rounds.empty()) StagedRounds(ctx, device, std::move(job), slots).run();
}

}  // namespace smdccl
