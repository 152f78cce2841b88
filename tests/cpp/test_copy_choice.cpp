// How a shared-memory link chooses to copy (transport/copy_choice.h), on a
// simulated clock: each way measured first, the cheaper one kept, the other
// tried again every kRetryNs for three rings' worth, and the reader told
// the way of every byte it times.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "check.h"
#include "transport/copy_choice.h"

using smdccl::CopyChoice;
using smdccl::CopyWay;

namespace {
constexpr size_t kRing = 1 << 20;
constexpr size_t kPiece = 128 << 10;

// Copies pieces for `ns` of simulated time, each taking the way's cost
// (copy and reading alike), and returns the way of every piece.
struct Simulation {
  CopyChoice choice{CopyChoice::Mode::Auto, kRing};
  uint64_t pos = 0;
  int64_t now = 1'000'000'000;
  double copyCost[2] = {0.05, 0.05};  // ns per byte
  double readCost[2] = {0.03, 0.03};

  std::vector<CopyWay> run(int64_t ns) {
    std::vector<CopyWay> ways;
    for (const int64_t end = now + ns; now < end; pos += kPiece) {
      choice.advance(pos, now);
      const CopyWay w = choice.wayFor(kPiece);
      const int i = static_cast<int>(w);
      const auto took = static_cast<int64_t>((copyCost[i] + readCost[i]) * kPiece);
      if (choice.settled(pos))
        choice.recordCopy(w, kPiece, static_cast<int64_t>(copyCost[i] * kPiece));
      // The reader's cost as it would publish it.
      choice.setReadCost(w, readCost[i]);
      now += took;
      ways.push_back(w);
    }
    return ways;
  }
};

// Changes from plain to streamed in `ways`.
int epochsOfStreaming(const std::vector<CopyWay>& ways) {
  int n = 0;
  for (size_t i = 1; i < ways.size(); ++i)
    n += ways[i] == CopyWay::Streamed && ways[i - 1] == CopyWay::Plain;
  return n;
}

size_t count(const std::vector<CopyWay>& ways, CopyWay w) {
  size_t n = 0;
  for (CopyWay x : ways) n += x == w;
  return n;
}
}  // namespace

TEST(copy_choice_measures_both_ways_then_keeps_plain_where_it_is_cheaper) {
  Simulation s;
  s.copyCost[1] = 0.07;  // streamed: the reader reads from memory
  s.readCost[1] = 0.06;
  std::vector<CopyWay> ways = s.run(1'000'000'000);
  // Plain first, for three rings, then streamed for three.
  CHECK(ways.size() > 48);
  for (size_t i = 0; i < 24; ++i) CHECK(ways[i] == CopyWay::Plain);
  for (size_t i = 24; i < 48; ++i) CHECK(ways[i] == CopyWay::Streamed);
  CHECK(s.choice.preferred() == CopyWay::Plain);
  // Then streamed again only every kRetryNs, three rings each time.
  const int64_t retries = 1'000'000'000 / CopyChoice::kRetryNs;
  const int epochs = epochsOfStreaming(ways);
  CHECK(epochs >= retries - 1 && epochs <= retries + 1);
  CHECK(count(ways, CopyWay::Streamed) <= static_cast<size_t>(epochs) * 3 * kRing / kPiece);
}

TEST(copy_choice_streams_where_plain_costs_over_its_threshold_and_turns_back) {
  Simulation s;
  s.copyCost[0] = 0.42;  // plain: every line taken back from the reader's cache
  s.copyCost[1] = 0.04;
  s.readCost[1] = 0.06;
  std::vector<CopyWay> ways = s.run(1'000'000'000);
  CHECK(s.choice.preferred() == CopyWay::Streamed);
  CHECK(count(ways, CopyWay::Plain) * 10 < ways.size());
  // Plain tried again every kRetryNs: the processes moved, plain is cheap.
  s.copyCost[0] = 0.05;
  ways = s.run(1'000'000'000);
  CHECK(s.choice.preferred() == CopyWay::Plain);
  CHECK(ways.back() == CopyWay::Plain);
  // Within the threshold plain stays.
  s.copyCost[0] = 0.05 + 0.03;
  s.copyCost[1] = 0.02;
  s.readCost[1] = 0.03;  // streamed: 0.05, plain 0.11 (< 2.5x)
  s.run(1'000'000'000);
  CHECK(s.choice.preferred() == CopyWay::Plain);
}

TEST(copy_choice_plain_for_small_pieces_and_the_forced_modes) {
  CopyChoice autoMode(CopyChoice::Mode::Auto, kRing);
  CHECK(autoMode.wayFor(CopyChoice::kTimedFrom - 1) == CopyWay::Plain);
  CHECK(!autoMode.timed(CopyChoice::kTimedFrom - 1) && autoMode.timed(CopyChoice::kTimedFrom));
  CopyChoice plain(CopyChoice::Mode::Plain, kRing), streamed(CopyChoice::Mode::Streamed, kRing);
  for (uint64_t pos = 0; pos < 8 * kRing; pos += kPiece) {
    plain.advance(pos, static_cast<int64_t>(pos) * 1000);
    streamed.advance(pos, static_cast<int64_t>(pos) * 1000);
    CHECK(plain.wayFor(kPiece) == CopyWay::Plain);
    CHECK(streamed.wayFor(kPiece) == CopyWay::Streamed);
  }
  CHECK(streamed.wayFor(CopyChoice::kTimedFrom - 1) == CopyWay::Plain);
  CHECK(!plain.timed(kPiece) && !streamed.timed(kPiece));
}

TEST(copy_choice_tells_the_reader_the_way_of_each_byte) {
  // Word: plain from 0 (the zeroed header): the first ring is not timed.
  CHECK(!CopyChoice::settledWayAt(0, 0, kRing));
  CHECK(CopyChoice::settledWayAt(0, kRing, kRing) == CopyWay::Plain);
  Simulation s;
  s.copyCost[1] = 0.07;
  s.run(300'000);  // into the first streamed epoch (pieces of 10.5 us)
  const uint64_t word = s.choice.wayWord();
  const uint64_t from = word >> 1;
  CHECK(from == 3 * kRing && (word & 1) == 1);
  CHECK(CopyChoice::settledWayAt(word, from - 1, kRing) == CopyWay::Plain);
  CHECK(!CopyChoice::settledWayAt(word, from, kRing));
  CHECK(!CopyChoice::settledWayAt(word, from + kRing - 1, kRing));
  CHECK(CopyChoice::settledWayAt(word, from + kRing, kRing) == CopyWay::Streamed);
}

TEST(running_cost_damps_one_slow_sample) {
  smdccl::RunningCost c;
  CHECK(c.value() == 0);
  c.add(4096, 4096);
  CHECK(c.value() == 1.0);
  c.add(409600, 4096);  // a preempted copy: counts as 4x
  CHECK(c.value() == 1.75);
  c.add(7168, 4096);
  CHECK(c.value() == 1.75);
  c.add(0, 4096);  // a clock that did not move: 1 ns
  CHECK(c.value() == 1.75 + (1.0 / 4096 - 1.75) / 4);
}
