#pragma once
// Whether a peer's process still exists, asked of its TCP listener.
//
// A rank that waits for a peer to connect to it (the higher rank of a TCP
// collective link, the receiver of a send/recv socket) cannot otherwise tell
// a peer that is slow to get there from one that died before it dialled: no
// connection existed to drop, and if the dead rank was the only one that
// would have dialled, nobody was refused and recorded a failure. The
// listener was listening before its address was published and lives as long
// as its process, so its refusing connections for kRefusedMeansGone means the
// process has exited. An accepted probe says Hello on Channel::Probe and is
// closed by the listener without being counted as a rejected stranger.
#include <chrono>
#include <functional>
#include <mutex>
#include <string>

#include "transport/socket_util.h"
#include "transport/tcp_listener.h"

namespace smdccl {

// How often a ListenerProbe asks and when refusals mean "gone". The defaults
// are the library's; the unit tests run the same rules on a shorter clock.
struct ListenerProbeTiming {
  // One connection attempt at most this often, the first once a wait has
  // lasted this long (most waits for a connection end in milliseconds: they
  // cost the peer no probe)...
  std::chrono::milliseconds every{500};
  // ...backing off to this while the peer answers (alive, or not answering).
  std::chrono::milliseconds maxEvery{8000};
  // ...each waiting at most this long for an answer (a host that drops
  // packets is "no sign", not "gone").
  std::chrono::milliseconds attemptWait{250};
  // Refusals lasting this long without a break mean the process has exited.
  std::chrono::milliseconds refusedMeansGone{kRefusedMeansGone};
};

class ListenerProbe {
 public:
  ListenerProbe(const GroupToken& token, int myRank, int peerRank, ListenerProbeTiming timing = {})
      : token_(token),
        myRank_(myRank),
        peerRank_(peerRank),
        timing_(timing),
        interval_(timing.every),
        refused_(timing.refusedMeansGone) {}

  // Why the peer is gone, or "" while there is no sign of it. Waits ask
  // between their attempts (at least every timing.every; a longer pause starts a
  // new wait, and refusals count within one wait only). `address`
  // gives the peer's listener ("ip:port", or "" while unpublished); it is
  // asked only when an attempt is due. Thread-safe; a caller that finds an
  // attempt in flight does not wait for it.
  std::string check(const std::function<std::string()>& address);

 private:
  // ECONNREFUSED, 0 (accepted: alive) or another errno (no sign either way).
  int attempt(const std::string& address);

  const GroupToken token_;
  const int myRank_;
  const int peerRank_;
  const ListenerProbeTiming timing_;
  std::mutex mu_;
  bool inFlight_ = false;
  std::chrono::steady_clock::time_point nextAttempt_{};
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point lastAsked_{};  // a new wait after a pause
  RefusalSpan refused_;                                // within the current wait
  std::string verdict_;
};

}  // namespace smdccl
