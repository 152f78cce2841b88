#include "transport/listener_probe.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "common/error.h"
#include "transport/socket_util.h"

namespace smdccl {

int ListenerProbe::attempt(const std::string& address) {
  std::string ip;
  int port = 0;
  splitHostPort(address, &ip, &port);
  int fd = -1;
  int err = tryConnectOnce(ip, port, Deadline::after(timing_.attemptWait), &fd);
  if (err != 0) return err;
  auto wire = memberHello(token_, myRank_, peerRank_, Channel::Probe);
  try {
    // So that the listener knows a member asked; the answer was the accept.
    sendAll(fd, wire.data(), wire.size(),
            {.deadline = Deadline::after(timing_.attemptWait), .what = address});
  } catch (const CommError&) {}
  close(fd);
  return 0;
}

std::string ListenerProbe::check(const std::function<std::string()>& address) {
  using Clock = std::chrono::steady_clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    bool newWait = now - lastAsked_ > 2 * timing_.every;
    lastAsked_ = now;
    if (newWait && !inFlight_) {
      // Refusals seen in an earlier wait do not count towards this one.
      nextAttempt_ = now + timing_.every;
      interval_ = timing_.every;
      refused_.reset();
    }
    if (!verdict_.empty() || inFlight_ || now < nextAttempt_) return verdict_;
    inFlight_ = true;
  }
  // The attempt (up to timing_.attemptWait) runs outside the lock: the progress
  // thread and a send/recv thread may both be waiting for this peer.
  std::string at;
  int err = EAGAIN;
  try {
    at = address();
    if (!at.empty()) err = attempt(at);
  } catch (const std::exception&) {
    // No answer is no sign: the wait's own deadline still applies.
  }
  std::lock_guard<std::mutex> lock(mu_);
  inFlight_ = false;
  auto now = Clock::now();
  // While refusals are being confirmed, ask every timing_.every; a peer that
  // answers (or does not answer at all) is asked less and less often, so
  // many ranks waiting long for one slow peer do not flood its listener.
  interval_ = err == ECONNREFUSED ? timing_.every : std::min(interval_ * 2, timing_.maxEvery);
  nextAttempt_ = now + interval_;
  if (refused_.refusedLongEnough(err, now))
    verdict_ = strCat("rank ", peerRank_, "'s listener at ", at, " refused connections",
                      refused_.meaning());
  return verdict_;
}

}  // namespace smdccl
