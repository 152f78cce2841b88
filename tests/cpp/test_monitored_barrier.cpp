// The monitored_barrier protocol (common/monitored_barrier.h) with threads
// as ranks over an in-memory store: everyone passes, and the store does not
// grow over repeated barriers; a late rank is named by rank 0 and, at once,
// by the ranks that came; wait_all_ranks names every late rank; without
// rank 0 the others name it; a rank that comes after the verdict raises too.
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "common/error.h"
#include "common/monitored_barrier.h"
#include "memory_store.h"

using namespace smdccl;

namespace {

struct Outcome {
  std::string error;  // "" if it passed
  double seconds = 0;
};

// Runs barrier `seq` on the ranks in `present` (of `size`), one thread each.
// `graceMs`: how much longer than the timeout the others wait for rank 0's
// verdict (long where they should get it: threads may start late under load).
std::vector<Outcome> runBarrier(MemoryStore& store, int size, const std::vector<int>& present,
                                uint64_t seq, int timeoutMs, bool waitAll, int graceMs = 3000) {
  std::vector<Outcome> out(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r : present) {
    threads.emplace_back([&, r] {
      MonitoredBarrierCall call;
      call.rank = r;
      call.size = size;
      call.seq = seq;
      call.timeout = std::chrono::milliseconds(timeoutMs);
      call.verdictGrace = std::chrono::milliseconds(graceMs);
      call.waitAllRanks = waitAll;
      call.group = "g";
      auto t0 = std::chrono::steady_clock::now();
      try {
        monitoredBarrier(store, call, [](const std::vector<int>& late) {
          return strCat("described ", late.size());
        });
      } catch (const CommError& e) {
        out[static_cast<size_t>(r)].error = e.what();
        CHECK(e.kind() == CommError::Kind::Timeout);
      }
      out[static_cast<size_t>(r)].seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

}  // namespace

TEST(monitored_barrier_passes_and_cleans_up) {
  MemoryStore store;
  size_t keysAfterFirst = 0;
  for (uint64_t seq = 1; seq <= 30; ++seq) {
    auto out = runBarrier(store, 4, {0, 1, 2, 3}, seq, 5000, false);
    for (const auto& o : out) CHECK(o.error.empty());
    if (seq == 2) keysAfterFirst = store.keyCount();
  }
  CHECK(keysAfterFirst > 0);
  CHECK(store.keyCount() == keysAfterFirst);  // one verdict, not one per barrier
}

TEST(monitored_barrier_names_the_first_late_rank_everywhere) {
  MemoryStore store;
  auto out = runBarrier(store, 4, {0, 1, 3}, 1, 300, false);
  CHECK(contains(out[0].error, "Rank 2 failed to pass monitoredBarrier in 300 ms"));
  CHECK(contains(out[0].error, "group 'g'"));
  CHECK(contains(out[0].error, "described 1"));
  // the ranks that came raise with rank 0's verdict, not at their own timeout
  CHECK(out[1].error == out[0].error);
  CHECK(out[3].error == out[0].error);
  CHECK(out[1].seconds < 0.3 + 2.5);  // at rank 0's deadline, not at its own 0.3 + 3 s
  // rank 2 comes late: it sees the verdict and raises too
  auto late = runBarrier(store, 4, {2}, 1, 300, false);
  CHECK(late[2].error == out[0].error);
  // the next barrier is clean again
  auto next = runBarrier(store, 4, {0, 1, 2, 3}, 2, 3000, false);
  for (const auto& o : next) CHECK(o.error.empty());
}

TEST(monitored_barrier_wait_all_ranks_names_every_late_rank) {
  MemoryStore store;
  auto out = runBarrier(store, 5, {0, 2, 4}, 1, 300, true);
  CHECK(contains(out[0].error, "Ranks 1, 3 failed to pass monitoredBarrier in 300 ms"));
  CHECK(!contains(out[0].error, "wait_all_ranks=True names"));
  CHECK(out[2].error == out[0].error && out[4].error == out[0].error);
  auto first = runBarrier(store, 5, {0, 2, 4}, 2, 300, false);
  CHECK(contains(first[0].error, "Rank 1 failed") && !contains(first[0].error, "Ranks"));
}

TEST(monitored_barrier_without_rank_0) {
  MemoryStore store;
  auto out = runBarrier(store, 3, {1, 2}, 1, 300, false, 200);
  for (int r : {1, 2}) {
    CHECK(contains(out[static_cast<size_t>(r)].error, "rank 0 gave no verdict within 500 ms"));
    CHECK(out[static_cast<size_t>(r)].seconds >= 0.45);
  }
}
