#include "common/monitored_barrier.h"

#include <cstdint>
#include <algorithm>
#include <thread>

#include "common/error.h"

namespace smdccl {

namespace {

std::string prefix(uint64_t seq) { return strCat("smdccl/mb/", seq, "/"); }
std::string arrivedKey(uint64_t seq, int rank) { return strCat(prefix(seq), "arrived/", rank); }
std::string verdictKey(uint64_t seq) { return prefix(seq) + "verdict"; }
const char* const kPassed = "ok";

std::string rankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "Rank " : "Ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += strCat(i ? ", " : "", ranks[i]);
  return s;
}

// Waits for `key` by asking whether it exists, with sleeps of up to 50 ms
// in between: a blocking store wait would hold the store client, which this
// process's other threads (the watchdog answering "what are you doing?",
// other groups) share, for the whole timeout.
bool appears(KVStore& store, const std::string& key, Deadline deadline) {
  auto pause = std::chrono::milliseconds(1);
  while (!store.check(key)) {
    if (deadline.expired()) return false;
    std::this_thread::sleep_for(
        std::min(pause, std::max(deadline.remaining(), std::chrono::milliseconds(1))));
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
  }
  return true;
}

void raiseIfFailed(const std::string& verdict) {
  if (verdict != kPassed) throw CommError(CommError::Kind::Timeout, verdict);
}

// Rank 0: the ranks whose announcement did not come by the deadline (the
// first only, unless waitAllRanks).
std::vector<int> lateRanks(KVStore& store, const MonitoredBarrierCall& call, Deadline deadline) {
  std::vector<int> late;
  for (int r = 1; r < call.size; ++r) {
    if (!late.empty()) {  // past the deadline already: only look
      if (!store.check(arrivedKey(call.seq, r))) late.push_back(r);
      continue;
    }
    if (!appears(store, arrivedKey(call.seq, r), deadline)) {
      late.push_back(r);
      if (!call.waitAllRanks) break;
    }
  }
  return late;
}

}  // namespace

void monitoredBarrier(KVStore& store, const MonitoredBarrierCall& call,
                      const DescribeRanks& describe) {
  if (call.rank != 0) {
    store.set(arrivedKey(call.seq, call.rank), "1");
    auto wait = call.timeout + call.verdictGrace;
    if (!appears(store, verdictKey(call.seq), Deadline::after(wait)))
      throw CommError(CommError::Kind::Timeout,
                      strCat("smdccl: monitored_barrier #", call.seq, " on group '", call.group,
                             "' (rank ", call.rank, "): rank 0 gave no verdict within ",
                             wait.count(), " ms (it has not reached the barrier, or it is gone)"));
    raiseIfFailed(store.get(verdictKey(call.seq), Deadline::after(call.verdictGrace)));
    return;
  }
  const int64_t ms = call.timeout.count();
  std::vector<int> late = lateRanks(store, call, Deadline::after(call.timeout));
  std::string verdict = kPassed;
  if (!late.empty()) {
    verdict = strCat(rankList(late), " failed to pass monitoredBarrier in ", ms,
                     " ms (smdccl: monitored_barrier #", call.seq, " on group '", call.group, "'",
                     call.waitAllRanks ? "" : "; wait_all_ranks=True names every late rank", ")");
    std::string doing;
    try {
      if (describe) doing = describe(late);
    } catch (const std::exception&) {
      // Only the description is lost: the verdict must still go out.
    }
    if (!doing.empty()) verdict += "; " + doing;
  }
  store.set(verdictKey(call.seq), verdict);
  raiseIfFailed(verdict);
  // Everyone passed call seq, so everyone has read the verdict of seq-1.
  // Best effort: the barrier passed whatever happens here.
  try {
    for (int r = 1; r < call.size; ++r) store.remove(arrivedKey(call.seq, r));
    if (call.seq > 1) store.remove(verdictKey(call.seq - 1));
  } catch (const std::exception&) {}
}

}  // namespace smdccl
