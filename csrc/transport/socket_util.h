#pragma once
// Small POSIX socket helpers shared by the TCP listener and links.
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <atomic>
#include <chrono>
#include <functional>
#include <string>

#include "common/deadline.h"

namespace smdccl {

// `err` (errno) after a non-blocking socket call that moved nothing: not a
// failure, only nothing to do now (try again at the next poll).
inline bool tryAgain(int err) { return err == EAGAIN || err == EWOULDBLOCK || err == EINTR; }

// The IPv4 address this process should listen on: SMDCCL_SOCKET_IFNAME's
// address if set, else the source address of the route to `masterAddr`
// (found with a UDP connect, which sends nothing), else 127.0.0.1.
std::string pickLocalAddress(const std::string& masterAddr);

// Binds and listens on ip:0; returns the fd and the chosen port.
int listenOn(const std::string& ip, int* port);

// Whether a peer is known to be gone: why, or "" while there is no sign of
// it. Asked between the attempts of a connection wait, so that waiting for a
// peer that has exited ends at once rather than at the deadline.
using PeerGoneProbe = std::function<std::string()>;

// How long a peer's listener may refuse connections before connectTo (and
// ListenerProbe) conclude that its process is gone.
constexpr std::chrono::milliseconds kRefusedMeansGone{2000};

// The kRefusedMeansGone rule over a series of connection attempts: how long
// they have been refused without a break.
class RefusalSpan {
 public:
  using Clock = std::chrono::steady_clock;
  explicit RefusalSpan(std::chrono::milliseconds gone = kRefusedMeansGone) : gone_(gone) {}
  // Records an attempt's errno (0: connected); true once refusals have
  // lasted the span's length (kRefusedMeansGone).
  bool refusedLongEnough(int err, Clock::time_point now);
  void reset() { since_ = Clock::time_point{}; }
  // " for 2000 ms (its process has exited)": the end of the messages.
  std::string meaning() const;

 private:
  std::chrono::milliseconds gone_;
  Clock::time_point since_{};  // epoch: not being refused
};

// How long a blocking socket call may wait, and what ends it sooner.
struct SocketWait {
  Deadline deadline;
  std::string what;                           // names the peer in errors ("rank 3")
  const std::atomic<bool>* cancel = nullptr;  // when set, the wait ends (shutdown)
  PeerGoneProbe gone{};                       // connections: saying why ends the wait
};

// Connects (retrying failed attempts until the deadline; refusals for
// kRefusedMeansGone end it with a PeerFailure) and returns a blocking fd.
// Each attempt is a non-blocking connect() waited for in poll() slices, so a
// host that never answers (dropped SYNs) ends the wait at the deadline, not
// at the kernel's SYN timeout.
// `w.gone`, saying why, ends the wait with a PeerFailure.
int connectTo(const std::string& ip, int port, const SocketWait& w);
// One connection attempt, waited for until `deadline`: 0 with *fd set (a
// blocking socket) once connected, else the attempt's errno (ETIMEDOUT when
// the deadline came first: no answer).
int tryConnectOnce(const std::string& ip, int port, Deadline deadline, int* fd);
// Throws CommError(PeerFailure) with the probe's reason when it gives one.
void throwIfGone(const PeerGoneProbe& gone);

void setNonBlocking(int fd, bool on);
void tuneDataSocket(int fd);  // TCP_NODELAY, buffer sizes

// Moves exactly n bytes on a socket (blocking or not), waiting with poll()
// until w.deadline; throws CommError naming w.what. `sent`, when given,
// counts the bytes that went out (also when it throws).
void sendAll(int fd, const void* buf, size_t n, const SocketWait& w, size_t* sent = nullptr);
void recvAll(int fd, void* buf, size_t n, const SocketWait& w);

std::string peerAddressOf(int fd);

// "ip:port" <-> parts.
std::string joinHostPort(const std::string& ip, int port);
void splitHostPort(const std::string& hp, std::string* ip, int* port);

}  // namespace smdccl
