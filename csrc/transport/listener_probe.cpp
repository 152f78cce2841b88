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
  int err = tryConnectOnce(ip, port, Deadline::after(kAttemptWait), &fd);
  if (err != 0) return err;
  auto wire = memberHello(token_, myRank_, peerRank_, Channel::Probe);
  try {
    // So that the listener knows a member asked; the answer was the accept.
    sendAll(fd, wire.data(), wire.size(), Deadline::after(kAttemptWait), address);
  } catch (const CommError&) {
  }
  close(fd);
  return 0;
}

std::string ListenerProbe::check(const std::function<std::string()>& address) {
  using Clock = std::chrono::steady_clock;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    bool newWait = now - lastAsked_ > 2 * kEvery;
    lastAsked_ = now;
    if (newWait && !inFlight_) {
      // Refusals seen in an earlier wait do not count towards this one.
      nextAttempt_ = now + kEvery;
      interval_ = kEvery;
      refused_.reset();
    }
    if (!verdict_.empty() || inFlight_ || now < nextAttempt_) return verdict_;
    inFlight_ = true;
  }
  // The attempt (up to kAttemptWait) runs outside the lock: the progress
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
  // While refusals are being confirmed, ask every kEvery; a peer that
  // answers (or does not answer at all) is asked less and less often, so
  // many ranks waiting long for one slow peer do not flood its listener.
  interval_ = err == ECONNREFUSED ? kEvery : std::min(interval_ * 2, kMaxEvery);
  nextAttempt_ = now + interval_;
  if (refused_.refusedLongEnough(err, now))
    verdict_ = strCat("rank ", peerRank_, "'s listener at ", at, " refused connections",
                      RefusalSpan::meaning());
  return verdict_;
}

}  // namespace smdccl
