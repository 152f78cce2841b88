#include "algorithms/stream_barrier.h"

#include "common/error.h"

namespace smdccl {

namespace {
uint32_t load(const uint32_t* flag) {
  return reinterpret_cast<const std::atomic<uint32_t>*>(flag)->load(std::memory_order_acquire);
}
}  // namespace

StreamBarrier::StreamBarrier(FlagMatrix flags, int me, uint32_t epoch)
    : flags_(flags), me_(me), epoch_(epoch) {}

uint32_t StreamBarrier::arrive(FlagQueue& q) {
  const uint32_t e = epoch_.load(std::memory_order_relaxed) + 1;
  const int n = flags_.localSize;
  // Arrive everywhere first, then wait: a wait before the last write would
  // hold this rank's later arrivals back behind a slow peer.
  for (int w = 0; w < n; ++w)
    if (w != me_) q.write(flags_.slot(w, me_), e);
  for (int a = 0; a < n; ++a)
    if (a != me_) q.waitFor(flags_.slot(me_, a), e);
  epoch_.store(e, std::memory_order_release);
  return e;
}

std::vector<int> StreamBarrier::missing(uint32_t epoch) const {
  std::vector<int> out;
  for (int a = 0; a < flags_.localSize; ++a)
    if (a != me_ && !flagReached(load(flags_.slot(me_, a)), epoch)) out.push_back(a);
  return out;
}

void StreamBarrier::release() {
  const uint32_t past = epoch_.load(std::memory_order_acquire) + (1u << 20);
  for (int a = 0; a < flags_.localSize; ++a)
    reinterpret_cast<std::atomic<uint32_t>*>(flags_.slot(me_, a))
        ->store(past, std::memory_order_release);
}

void StreamBarrier::giveUp(uint32_t epoch) {
  uint64_t none = 0;
  const uint64_t mine = (static_cast<uint64_t>(me_ + 1) << 32) | epoch;
  reinterpret_cast<std::atomic<uint64_t>*>(flags_.verdict())
      ->compare_exchange_strong(none, mine, std::memory_order_acq_rel);
}

StreamBarrier::Verdict StreamBarrier::verdict() const {
  const uint64_t v = reinterpret_cast<const std::atomic<uint64_t>*>(flags_.verdict())
                         ->load(std::memory_order_acquire);
  if (v == 0) return {};
  return {static_cast<int>(v >> 32) - 1, static_cast<uint32_t>(v)};
}

void BarrierWatch::add(Pending p) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(std::move(p));
}

size_t BarrierWatch::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size();
}

bool BarrierWatch::oldest(const StreamBarrier& b, uint32_t* epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  while (!pending_.empty() && b.missing(pending_.front().epoch).empty()) pending_.pop_front();
  if (pending_.empty()) return false;
  *epoch = pending_.front().epoch;
  return true;
}

std::string BarrierWatch::check(const StreamBarrier& b, const std::function<int(int)>& groupRank,
                                uint32_t* epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  const StreamBarrier::Verdict v = b.verdict();
  if (v.by >= 0 && v.by != b.me()) {
    if (epoch) *epoch = v.epoch;
    return strCat("smdccl: rank ", groupRank(v.by),
                  " gave up at a GPU barrier of the node (it failed or timed out there), so "
                  "the GPU work this rank queued from that barrier on cannot be trusted");
  }
  while (!pending_.empty()) {
    std::vector<int> gone = b.missing(pending_.front().epoch);
    if (gone.empty()) {
      pending_.pop_front();
      continue;
    }
    const Pending& p = pending_.front();
    if (!p.deadline.expired()) return "";
    std::string ranks;
    for (int l : gone) ranks += strCat(ranks.empty() ? "" : ", ", groupRank(l));
    if (epoch) *epoch = p.epoch;
    return strCat("smdccl: ", p.what(), ": timed out at a GPU barrier of the node: rank",
                  gone.size() > 1 ? "s " : " ", ranks, gone.size() > 1 ? " have" : " has",
                  " not arrived (their GPU streams never reached this step; the process may "
                  "be gone, stalled, or running other collectives)");
  }
  return "";
}

}  // namespace smdccl
