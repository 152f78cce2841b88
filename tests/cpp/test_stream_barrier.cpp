// Stream barriers (algorithms/stream_barrier.h) with their host stand-in for
// a device stream (HostFlagQueue) and the node's flags in real shared memory
// (transport/node_flags.h): the program a CUDA-IPC collective queues, run by
// threads. The GPU run checks the CUDA queue (stream memory operations).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "host_flag_queue.h"
#include "algorithms/stream_barrier.h"
#include "algorithms/stream_gate.h"
#include "check.h"
#include "memory_store.h"
#include "transport/node_flags.h"

using namespace smdccl;

namespace {

using namespace std::chrono_literals;

// Plain memory for one process's flag matrix (zeroed, aligned).
struct LocalFlags {
  std::vector<uint64_t> words;
  int n;
  explicit LocalFlags(int localSize, uint32_t start = 0)
      : words(FlagMatrix::bytesFor(localSize) / 8, 0), n(localSize) {
    for (int w = 0; w < n; ++w)
      for (int a = 0; a < n; ++a) *matrix().slot(w, a) = start;
  }
  FlagMatrix matrix() { return {reinterpret_cast<char*>(words.data()), n}; }
};

bool waitUntil(const std::function<bool()>& cond, std::chrono::milliseconds limit = 5000ms) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!cond()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

}  // namespace

TEST(flag_reached_compares_cyclically) {
  CHECK(flagReached(5, 5));
  CHECK(flagReached(6, 5));
  CHECK(!flagReached(4, 5));
  CHECK(flagReached(3, 0xFFFFFFF0u));   // wrapped past it
  CHECK(!flagReached(0xFFFFFFF0u, 3));  // not yet wrapped
}

// Four ranks each publish a value, meet, read every rank's, meet again, for
// many rounds; ranks are slowed at random. A barrier that let a rank through
// early would have it read a stale or a next-round value.
TEST(stream_barrier_orders_each_rank_s_work_between_the_node_s) {
  constexpr int kRanks = 4, kRounds = 300;
  MemoryStore store;
  std::vector<std::atomic<int>> data(kRanks);
  std::atomic<int> wrong{0}, reads{0};
  std::atomic<int> notDrained{0}, unusable{0};
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r)
    ranks.emplace_back([&, r] {
      NodeFlags flags(store, {"flags", r, kRanks, nullptr}, Deadline::after(10s));
      if (!flags.usable()) ++unusable;
      StreamBarrier barrier(flags.matrix(), r);
      HostFlagQueue q;
      std::mt19937 rng(r);
      for (int i = 1; i <= kRounds; ++i) {
        bool slow = rng() % 8 == 0;
        q.run([&, r, i, slow] {
          if (slow) std::this_thread::sleep_for(50us);
          data[r].store(i * 16 + r, std::memory_order_relaxed);
        });
        barrier.arrive(q);
        q.run([&, i] {
          for (int p = 0; p < kRanks; ++p) {
            ++reads;
            if (data[p].load(std::memory_order_relaxed) != i * 16 + p) ++wrong;
          }
        });
        barrier.arrive(q);
      }
      if (!q.drain(Deadline::after(30s))) ++notDrained;
      if (barrier.lastEpoch() != 2 * kRounds) ++wrong;
    });
  for (auto& t : ranks) t.join();
  CHECK(unusable.load() == 0);
  CHECK(notDrained.load() == 0);
  CHECK(reads.load() == kRanks * kRanks * kRounds);
  CHECK(wrong.load() == 0);
}

// Rank 2 never arrives: the others' queues stop at the barrier, the watch
// names rank 2 (as the group numbers it) once the deadline has passed, and
// release() lets one rank's queue drain without releasing its node-mate.
TEST(stream_barrier_names_a_missing_rank_and_release_drains_one_queue) {
  LocalFlags mem(3);
  StreamBarrier b0(mem.matrix(), 0), b1(mem.matrix(), 1);
  auto q0 = std::make_unique<HostFlagQueue>();
  auto q1 = std::make_unique<HostFlagQueue>();
  std::atomic<bool> after0{false}, after1{false};
  uint32_t e = b0.arrive(*q0);
  b1.arrive(*q1);
  q0->run([&] { after0 = true; });
  q1->run([&] { after1 = true; });
  CHECK(e == 1);
  // Each arrival is written by its own queue's thread: wait for both rows.
  CHECK(waitUntil([&] { return b0.missing(e) == std::vector<int>{2}; }));
  CHECK(waitUntil([&] { return b1.missing(e) == std::vector<int>{2}; }));
  std::this_thread::sleep_for(20ms);
  CHECK(!q0->idle() && !after0.load());

  auto groupRank = [](int local) { return local * 10 + 1; };
  BarrierWatch patient;  // not late yet: nothing to say
  patient.add({e, Deadline::after(std::chrono::hours(1)), [] { return std::string("x"); }});
  CHECK(patient.check(b0, groupRank).empty());
  CHECK(patient.pending() == 1);
  BarrierWatch watch;
  watch.add({e, Deadline::after(0ms), [] { return std::string("allreduce #3 on group 'g'"); }});
  uint32_t late = 0;
  std::string msg = watch.check(b0, groupRank, &late);
  CHECK(late == e);
  uint32_t first = 0;
  CHECK(watch.oldest(b0, &first) && first == e);
  CHECK(msg.find("allreduce #3 on group 'g'") != std::string::npos);
  CHECK(msg.find("rank 21 has not arrived") != std::string::npos);

  // Rank 0 gives up: its node-mates' watches hear of it (its own does not).
  CHECK(b1.verdict().by == -1);
  b0.giveUp(late);
  b1.giveUp(late + 5);  // the first verdict stays
  CHECK(b1.verdict().by == 0 && b1.verdict().epoch == late);
  BarrierWatch other;
  uint32_t at = 0;
  std::string heard = other.check(b1, groupRank, &at);
  CHECK(heard.find("rank 1 gave up at a GPU barrier") != std::string::npos);
  CHECK(at == late);
  CHECK(patient.check(b0, groupRank).empty());  // its own verdict: nothing new

  b0.release();
  CHECK(q0->drain(Deadline::after(5s)));
  CHECK(after0.load());
  std::this_thread::sleep_for(20ms);
  CHECK(!q1->idle() && !after1.load());       // its row is its own
  CHECK(watch.check(b0, groupRank).empty());  // released: passed
  CHECK(watch.pending() == 0);
  CHECK(!watch.oldest(b0, &first));
  b1.release();
  CHECK(q1->drain(Deadline::after(5s)));
}

// A barrier that passes is dropped by the watch, late or not.
TEST(barrier_watch_drops_passed_barriers) {
  LocalFlags mem(2);
  StreamBarrier b0(mem.matrix(), 0), b1(mem.matrix(), 1);
  HostFlagQueue q0, q1;
  BarrierWatch watch;
  for (int i = 0; i < 5; ++i) {
    uint32_t e = b0.arrive(q0);
    b1.arrive(q1);
    watch.add({e, Deadline::after(0ms), [] { return std::string("x"); }});
  }
  CHECK(q0.drain(Deadline::after(5s)) && q1.drain(Deadline::after(5s)));
  CHECK(watch.check(b0, [](int l) { return l; }).empty());
  CHECK(watch.pending() == 0);
}

// Epochs are 32-bit and wrap: barriers across the wrap still hold.
TEST(stream_barrier_epochs_wrap_around) {
  const uint32_t start = 0xFFFFFFF0u;
  LocalFlags mem(2, start);
  StreamBarrier b0(mem.matrix(), 0, start), b1(mem.matrix(), 1, start);
  HostFlagQueue q0, q1;
  std::atomic<int> order{0}, wrong{0};
  for (int i = 1; i <= 40; ++i) {
    // Round i runs after both ranks' round i-1 and before either's round i+1.
    auto step = [&, i] {
      int seen = order.fetch_add(1);
      if (seen < 2 * (i - 1) || seen > 2 * i - 1) ++wrong;
    };
    q0.run(step);
    q1.run(step);
    b0.arrive(q0);
    b1.arrive(q1);
  }
  CHECK(q0.drain(Deadline::after(5s)) && q1.drain(Deadline::after(5s)));
  CHECK(b0.lastEpoch() == start + 40);  // 0x18: wrapped
  CHECK(b0.missing(b0.lastEpoch()).empty());
  CHECK(order.load() == 80);
  CHECK(wrong.load() == 0);
}

// A rank whose `attach` fails (its GPU cannot map the flags) makes the
// flags unusable on every rank of the node, naming it.
TEST(node_flags_are_unusable_everywhere_when_one_rank_cannot_attach) {
  MemoryStore store;
  std::vector<std::string> why(3);
  std::vector<int> usable(3, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 3; ++r)
    ranks.emplace_back([&, r] {
      auto attach = [r](char* base, size_t bytes) -> std::string {
        if (bytes < FlagMatrix::bytesFor(3) || *reinterpret_cast<uint32_t*>(base) != 0)
          return "bad segment";
        return r == 1 ? "cannot map it" : "";
      };
      NodeFlags flags(store, {"nf", r, 3, attach}, Deadline::after(10s));
      usable[r] = flags.usable();
      why[r] = flags.why();
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 3; ++r) {
    CHECK(usable[r] == 0);
    CHECK(why[r] == "local rank 1: cannot map it");
  }
}

// A gate holds the queue's later work until the host releases it; a
// release opens every earlier gate too, and never closes a later one.
TEST(stream_gate_holds_work_until_released) {
  alignas(64) uint32_t flag = 0;
  StreamGate gate(&flag);
  HostFlagQueue q;
  std::atomic<int> ran{0};
  uint32_t first = gate.hold(q);
  q.run([&] { ran = 1; });
  uint32_t second = gate.hold(q);
  q.run([&] { ran = 2; });
  std::this_thread::sleep_for(20ms);
  CHECK(ran.load() == 0 && !q.idle());
  CHECK(!gate.released(first));
  gate.release(first);
  CHECK(waitUntil([&] { return ran.load() == 1; }));
  std::this_thread::sleep_for(20ms);
  CHECK(ran.load() == 1);  // the second gate still holds
  gate.release(second);
  gate.release(first);  // late: changes nothing
  CHECK(gate.released(second));
  CHECK(q.drain(Deadline::after(5s)));
  CHECK(ran.load() == 2);
  // Tickets wrap like epochs.
  flag = 0xFFFFFFFFu;
  StreamGate wrapped(&flag);
  uint32_t t = wrapped.hold(q);  // ticket 1, flag behind it by 2
  CHECK(t == 1 && !wrapped.released(t));
  wrapped.release(t);
  CHECK(wrapped.released(t) && flag == 1);
  CHECK(q.drain(Deadline::after(5s)));
}
