#pragma once
// dist.monitored_barrier(): gloo's debugging barrier, which says which ranks
// did not come. It runs through the store, not the links (the links may be
// what is broken, or never connected), on the caller's thread.
//
// Call k: every rank but 0 announces itself (key mb/k/arrived/<rank>) and
// waits for rank 0's verdict (mb/k/verdict); rank 0 waits for the
// announcements until the timeout, then writes "ok" or the failure, so that
// the ranks that did come raise with the same message at once instead of at
// their own timeout. A rank that comes after the verdict sees it and raises
// too. Rank 0 removes the keys of call k-1 once everyone has passed call k,
// so repeated barriers do not grow the store.
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/store.h"

namespace smdccl {

struct MonitoredBarrierCall {
  int rank = 0;
  int size = 1;
  uint64_t seq = 1;  // this rank's count of monitored barriers on the group, from 1
  std::chrono::milliseconds timeout{0};
  // How much longer than `timeout` the other ranks wait for rank 0's
  // verdict: rank 0 gives it at its deadline, after asking what the late
  // ranks are doing (DescribeRanks; it must take less than this).
  std::chrono::milliseconds verdictGrace{5000};
  bool waitAllRanks = false;  // name every late rank, not only the first
  std::string group;          // for messages
};

// What ranks are doing, for the failure message (e.g. "rank 1: last ran
// allreduce #4, still running"); may return "".
using DescribeRanks = std::function<std::string(const std::vector<int>&)>;

// Returns when every rank passed; throws CommError (Timeout) naming the ranks
// that did not come in time, or, on ranks other than 0, naming rank 0 when
// no verdict came.
void monitoredBarrier(KVStore& store, const MonitoredBarrierCall& call,
                      const DescribeRanks& describe = {});

}  // namespace smdccl
