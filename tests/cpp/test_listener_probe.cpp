// ListenerProbe: how a rank waiting for a peer to connect tells a peer that
// is slow from one whose process has exited. Against the real process-wide
// listener (alive) and a port nobody listens on any more (exited).
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "check.h"
#include "common/error.h"
#include "transport/listener_probe.h"
#include "transport/socket_util.h"
#include "transport/tcp_listener.h"

using namespace smdccl;

namespace {

using Clock = std::chrono::steady_clock;

GroupToken probeToken() {
  GroupToken t;
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<uint8_t>(0xa0 + i);
  return t;
}

// "ip:port" where a listener was and is no more: connections are refused,
// as they are once a rank's process has exited.
std::string exitedListenerAddress() {
  int port = 0;
  int fd = listenOn("127.0.0.1", &port);
  ::close(fd);
  return joinHostPort("127.0.0.1", port);
}

// The library's rules on a clock five times faster (every 100 ms, backing
// off to 1.6 s, gone after 400 ms of refusals), so that the tests of the
// rules take a fraction of the real windows; the exited-rank test keeps the
// real timing (the 2 s window and the message are the contract).
constexpr double kScale = 0.2;
ListenerProbeTiming fastTiming() {
  ListenerProbeTiming t;
  t.every = std::chrono::milliseconds(100);
  t.maxEvery = std::chrono::milliseconds(1600);
  t.refusedMeansGone = std::chrono::milliseconds(400);
  return t;
}

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Asks the probe every 10 ms until it has a verdict or `limit` seconds pass;
// returns when the verdict came (seconds), or -1.
double secondsToVerdict(ListenerProbe& probe, const std::function<std::string()>& address,
                        double limit, std::string* verdict) {
  auto start = Clock::now();
  while (secondsSince(start) < limit) {
    *verdict = probe.check(address);
    if (!verdict->empty()) return secondsSince(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

}  // namespace

TEST(listener_probe_of_a_live_rank_is_no_sign_and_not_a_rejection) {
  TcpListener& listener = TcpListener::instance("127.0.0.1");
  GroupToken token = probeToken();
  listener.registerGroup(token, 2, /*myRank=*/1);
  uint64_t rejectedBefore = listener.rejectedCount();
  ListenerProbe probe(token, /*myRank=*/0, /*peerRank=*/1, fastTiming());
  std::string verdict;
  double at = secondsToVerdict(probe, [&] { return listener.address(); }, 3.0 * kScale, &verdict);
  CHECK(at < 0);  // 3 attempts, all accepted
  CHECK(verdict.empty());
  // The probes were closed quietly: not counted as strangers, not handed to
  // the group as a connection.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  CHECK(listener.rejectedCount() == rejectedBefore);
  CHECK_THROWS(listener.take(
                   token, 0, Channel::Probe,
                   {.deadline = Deadline::after(std::chrono::milliseconds(200)), .what = "rank 0"}),
               CommError);
  CHECK_THROWS(listener.take(
                   token, 0, Channel::Collective,
                   {.deadline = Deadline::after(std::chrono::milliseconds(200)), .what = "rank 0"}),
               CommError);
  listener.unregisterGroup(token);
}

TEST(listener_probe_of_an_exited_rank_says_gone_after_two_seconds_of_refusals) {
  std::string dead = exitedListenerAddress();
  ListenerProbe probe(probeToken(), 0, 1);
  std::string verdict;
  double at = secondsToVerdict(probe, [&] { return dead; }, 6.0, &verdict);
  // The first attempt after 0.5 s of waiting, then 2 s of refusals.
  CHECK(at >= 2.5 && at < 4.5);
  CHECK(verdict.find("rank 1's listener at " + dead) != std::string::npos);
  CHECK(verdict.find("refused connections for 2000 ms (its process has exited)") !=
        std::string::npos);
  // The verdict stays.
  CHECK(probe.check([&] { return dead; }) == verdict);
}

TEST(listener_probe_waits_before_its_first_attempt) {
  // A wait that ends within `every` costs the peer nothing: no attempt, so
  // not even an unanswerable address is asked for.
  ListenerProbe probe(probeToken(), 0, 1, fastTiming());
  int asked = 0;
  auto ask = [&] {
    return probe.check([&] {
      ++asked;
      return std::string();
    });
  };
  auto start = Clock::now();
  while (secondsSince(start) < 0.4 * kScale) {
    CHECK(ask().empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(asked == 0);
  while (asked == 0 && secondsSince(start) < 5) {
    ask();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  CHECK(asked == 1);
  CHECK(secondsSince(start) >= 0.5 * kScale);
  // After a pause, a new wait: again no attempt at once.
  std::this_thread::sleep_for(std::chrono::milliseconds(240));
  ask();
  CHECK(asked == 1);
}

TEST(listener_probe_needs_the_refusals_to_last) {
  // Refused, refused, accepted (a listener that was briefly unreachable),
  // then refused again: the window counts from the first refusal after
  // the acceptance. Keyed to the attempts, not the clock, so a loaded
  // machine cannot move an attempt out of the "accepted" window.
  TcpListener& listener = TcpListener::instance("127.0.0.1");
  GroupToken token = probeToken();
  listener.registerGroup(token, 2, 1);
  std::string dead = exitedListenerAddress();
  int attempts = 0;
  Clock::time_point refusedAgainAt{};
  auto address = [&]() -> std::string {
    ++attempts;
    if (attempts == 3) return listener.address();
    if (attempts == 4) refusedAgainAt = Clock::now();
    return dead;
  };
  ListenerProbe probe(token, 0, 1, fastTiming());
  std::string verdict;
  secondsToVerdict(probe, address, 15.0, &verdict);
  CHECK(!verdict.empty());
  CHECK(attempts >= 5);
  CHECK(secondsSince(refusedAgainAt) >= 2.0 * kScale);
  listener.unregisterGroup(token);
}

TEST(listener_probe_refusals_of_an_earlier_wait_do_not_count) {
  // A refusal in one wait, a pause, then a new wait: its first refusal
  // starts the window afresh (it used to give the verdict at once).
  std::string dead = exitedListenerAddress();
  ListenerProbe probe(probeToken(), 0, 1, fastTiming());
  std::string verdict;
  auto address = [&] { return dead; };
  auto start = Clock::now();
  while (secondsSince(start) < 1.2 * kScale) {  // one or two refusals
    CHECK(probe.check(address).empty());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the wait ended
  double at = secondsToVerdict(probe, address, 6.0, &verdict);
  CHECK(at >= 2.5 * kScale);  // `every` before the first attempt, then the window
  CHECK(verdict.find("refused connections for 400 ms") != std::string::npos);
}

TEST(listener_probe_without_a_published_address_is_no_sign) {
  ListenerProbe probe(probeToken(), 0, 1, fastTiming());
  std::string verdict;
  CHECK(secondsToVerdict(probe, [] { return std::string(); }, 2.5 * kScale, &verdict) < 0);
  CHECK(verdict.empty());
}
