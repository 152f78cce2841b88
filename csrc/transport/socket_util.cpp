#include "transport/socket_util.h"

#include <cstdint>
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "common/env.h"
#include "common/error.h"
#include "common/log.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_TEXT(kSocketIfname, "SMDCCL_SOCKET_IFNAME", "",
                "Network interface for the TCP transport (default: the interface that routes to "
                "MASTER_ADDR).");
SMDCCL_ENV_INT(kTcpBufferKB, "SMDCCL_TCP_BUFFER_KB", 4096, 0, 1 << 20,
               "Socket send/receive buffer size for TCP links, in KiB (0: the system's "
               "default).");
}  // namespace env

static std::string addressOfInterface(const std::string& ifname) {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throwSystemError("getifaddrs", errno);
  std::string found;
  std::string seen;
  for (auto* it = list; it; it = it->ifa_next) {
    if (!it->ifa_addr || it->ifa_addr->sa_family != AF_INET) continue;
    seen += std::string(seen.empty() ? "" : ", ") + it->ifa_name;
    if (ifname == it->ifa_name) {
      char buf[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(it->ifa_addr)->sin_addr, buf, sizeof buf);
      found = buf;
      break;
    }
  }
  freeifaddrs(list);
  SMDCCL_CHECK_ARG(!found.empty(), "SMDCCL_SOCKET_IFNAME=", ifname,
                   " has no IPv4 address here; interfaces with one: ", seen);
  return found;
}

static bool resolveIPv4(const std::string& host, sockaddr_in* out) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0 || !res) return false;
  *out = *reinterpret_cast<sockaddr_in*>(res->ai_addr);
  freeaddrinfo(res);
  return true;
}

std::string pickLocalAddress(const std::string& masterAddr) {
  std::string ifname = envString(env::kSocketIfname);
  if (!ifname.empty()) return addressOfInterface(ifname);
  sockaddr_in dst{};
  if (!masterAddr.empty() && resolveIPv4(masterAddr, &dst)) {
    dst.sin_port = htons(9);  // any port: a UDP connect only consults the routing table
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd >= 0) {
      sockaddr_in local{};
      socklen_t len = sizeof local;
      bool ok = connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0 &&
                getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
      close(fd);
      if (ok) {
        char buf[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &local.sin_addr, buf, sizeof buf);
        return buf;
      }
    }
  }
  SMDCCL_INFO("no route to MASTER_ADDR '", masterAddr, "' found; listening on 127.0.0.1");
  return "127.0.0.1";
}

int listenOn(const std::string& ip, int* port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throwSystemError("socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = 0;
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) {
    close(fd);
    throw InvalidArgument("not an IPv4 address: " + ip);
  }
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 512) != 0) {
    int err = errno;
    close(fd);
    throwSystemError("bind/listen on " + ip, err);
  }
  socklen_t len = sizeof a;
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

static void throwIfCancelled(const std::atomic<bool>* cancel, const std::string& what) {
  if (cancel && cancel->load())
    throw CommError(CommError::Kind::Protocol, "shut down while talking to " + what);
}

void throwIfGone(const PeerGoneProbe& gone) {
  if (!gone) return;
  std::string why = gone();
  if (!why.empty()) throw CommError(CommError::Kind::PeerFailure, why);
}

// Waits for a non-blocking connect() in progress on `fd`: returns 0 once
// connected, the attempt's errno once it failed, or ETIMEDOUT at the
// deadline. Waiting in poll() slices rather than in a blocking connect()
// keeps a host that drops our SYNs (firewall, blackholed route, a listener
// whose queue is full) from holding us for the kernel's SYN timeout (about
// 2 min), and lets shutdown and the peer-gone probe end the wait.
static int awaitConnect(int fd, const SocketWait& w) {
  while (true) {
    pollfd p{fd, POLLOUT, 0};
    int ms = static_cast<int>(std::min<int64_t>(w.deadline.remaining().count(), 100));
    int r = poll(&p, 1, ms);
    if (r < 0 && errno != EINTR) return errno;
    if (r > 0) {
      int err = 0;
      socklen_t len = sizeof err;
      if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
      return err;
    }
    if (w.deadline.expired()) return ETIMEDOUT;
    throwIfCancelled(w.cancel, w.what);
    throwIfGone(w.gone);
  }
}

static sockaddr_in ipv4Address(const std::string& ip, int port, const std::string& what) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1)
    throw CommError(CommError::Kind::Protocol, "bad address published by " + what + ": " + ip);
  return a;
}

static int attemptConnect(const sockaddr_in& a, const SocketWait& w, int* fdOut) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throwSystemError("socket", errno);
  int err = connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) == 0 ? 0 : errno;
  if (err == EINPROGRESS) {
    try {
      err = awaitConnect(fd, w);
    } catch (...) {
      close(fd);
      throw;
    }
  }
  if (err != 0) {
    close(fd);
    return err;
  }
  setNonBlocking(fd, false);
  *fdOut = fd;
  return 0;
}

int tryConnectOnce(const std::string& ip, int port, Deadline deadline, int* fd) {
  return attemptConnect(ipv4Address(ip, port, ip), {.deadline = deadline, .what = ip}, fd);
}

bool RefusalSpan::refusedLongEnough(int err, Clock::time_point now) {
  if (err != ECONNREFUSED) {
    reset();
    return false;
  }
  if (since_ == Clock::time_point{}) since_ = now;
  return now - since_ >= gone_;
}

std::string RefusalSpan::meaning() const {
  return strCat(" for ", gone_.count(), " ms (its process has exited)");
}

int connectTo(const std::string& ip, int port, const SocketWait& w) {
  const Deadline deadline = w.deadline;
  const std::string& what = w.what;
  sockaddr_in a = ipv4Address(ip, port, what);
  int delayMs = 1;
  // The address comes from the peer's listener, which was listening before
  // it published it and lives as long as its process: a host that refuses
  // it for a while has no such process any more. (Refusals are not retried
  // for ever, nor failed at the first, in case a firewall or NAT rule is
  // being set up.)
  RefusalSpan refused;
  auto started = std::chrono::steady_clock::now();
  while (true) {
    int fd = -1;
    int err = attemptConnect(a, w, &fd);
    if (err == 0) return fd;
    auto now = std::chrono::steady_clock::now();
    if (refused.refusedLongEnough(err, now))
      throw CommError(CommError::Kind::PeerFailure,
                      strCat("cannot connect to ", what, " at ", ip, ":", port,
                             ": connection refused", refused.meaning()));
    bool retry = err == ECONNREFUSED || err == ETIMEDOUT || err == EINTR || err == EAGAIN ||
                 err == ENETUNREACH || err == EHOSTUNREACH;
    if (!retry || deadline.expired()) {
      auto waitedMs = std::chrono::duration_cast<std::chrono::milliseconds>(now - started).count();
      std::string why = err == ETIMEDOUT
                            ? strCat("no answer in ", waitedMs,
                                     " ms (is a firewall dropping the packets, or the host down?)")
                            : std::string(std::strerror(err));
      throw CommError(err == ETIMEDOUT || deadline.expired() ? CommError::Kind::Timeout
                                                             : CommError::Kind::System,
                      strCat("cannot connect to ", what, " at ", ip, ":", port, ": ", why));
    }
    throwIfCancelled(w.cancel, what);
    throwIfGone(w.gone);
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 100);
  }
}

void setNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void tuneDataSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  int64_t kb = envInt(env::kTcpBufferKB);
  if (kb > 0) {
    int bytes = static_cast<int>(kb * 1024);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
}

static void waitReady(int fd, short events, Deadline deadline, const std::string& what,
                      const char* verb) {
  pollfd p{fd, events, 0};
  int ms = static_cast<int>(std::min<int64_t>(deadline.remaining().count(), 100));
  int r = poll(&p, 1, ms);
  if (r < 0 && errno != EINTR) throwSystemError("poll", errno);
  if (r == 0 && deadline.expired())
    throw CommError(CommError::Kind::Timeout, strCat("timed out ", verb, " ", what));
}

void sendAll(int fd, const void* buf, size_t n, const SocketWait& w, size_t* sent) {
  const char* p = static_cast<const char*>(buf);
  if (sent) *sent = 0;
  while (n > 0) {
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
      if (sent) *sent += static_cast<size_t>(k);
    } else if (k < 0 && tryAgain(errno)) {
      throwIfCancelled(w.cancel, w.what);
      waitReady(fd, POLLOUT, w.deadline, w.what, "sending to");
    } else {
      throw CommError(CommError::Kind::PeerFailure,
                      strCat("connection to ", w.what, " failed: ", std::strerror(errno)));
    }
  }
}

void recvAll(int fd, void* buf, size_t n, const SocketWait& w) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t k = ::recv(fd, p, n, MSG_DONTWAIT);
    if (k > 0) {
      p += k;
      n -= static_cast<size_t>(k);
    } else if (k == 0) {
      throw CommError(CommError::Kind::PeerFailure, strCat(w.what, " closed the connection"));
    } else if (tryAgain(errno)) {
      throwIfCancelled(w.cancel, w.what);
      waitReady(fd, POLLIN, w.deadline, w.what, "receiving from");
    } else {
      throw CommError(CommError::Kind::PeerFailure,
                      strCat("connection to ", w.what, " failed: ", std::strerror(errno)));
    }
  }
}

std::string peerAddressOf(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "?";
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
  return joinHostPort(buf, ntohs(a.sin_port));
}

std::string joinHostPort(const std::string& ip, int port) {
  return ip + ":" + std::to_string(port);
}

void splitHostPort(const std::string& hp, std::string* ip, int* port) {
  auto colon = hp.rfind(':');
  if (colon == std::string::npos)
    throw CommError(CommError::Kind::Protocol, "malformed address '" + hp + "'");
  *ip = hp.substr(0, colon);
  *port = std::stoi(hp.substr(colon + 1));
}

}  // namespace smdccl
