#include "transport/tcp_listener.h"

#include <cstdint>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <vector>

#include "common/error.h"
#include "common/hex.h"
#include "common/log.h"
#include "transport/byte_order.h"
#include "transport/socket_util.h"

namespace smdccl {

namespace {
constexpr uint32_t kAck = 0x594b4f53;  // "SOKY": sent back once a Hello is accepted

// accept() failed for want of a resource: the connection stays in the
// backlog and poll() reports it again at once, so retrying without a pause
// spins a core until descriptors are freed.
bool outOfResources(int err) {
  return err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM;
}
constexpr auto kAcceptPause = std::chrono::milliseconds(100);
constexpr auto kResourceWarnEvery = std::chrono::seconds(10);

}  // namespace

HelloParse parseHello(const uint8_t* data, size_t len) {
  HelloParse r;
  if (data == nullptr || len < sizeof(Hello)) {
    r.why = "incomplete handshake";
    return r;
  }
  Hello& h = r.hello;
  h.magic = static_cast<uint32_t>(loadLE(data, 4));
  h.version = static_cast<uint16_t>(loadLE(data + 4, 2));
  h.channel = static_cast<uint16_t>(loadLE(data + 6, 2));
  h.srcRank = static_cast<int32_t>(loadLE(data + 8, 4));
  h.dstRank = static_cast<int32_t>(loadLE(data + 12, 4));
  std::memcpy(h.token.data(), data + 16, h.token.size());
  if (h.magic != Hello::kMagic || h.version != Hello::kVersion) {
    r.why = "bad magic or version";
    return r;
  }
  r.ok = true;
  return r;
}

void encodeHello(const Hello& h, uint8_t out[sizeof(Hello)]) {
  storeLE(out, h.magic, 4);
  storeLE(out + 4, h.version, 2);
  storeLE(out + 6, h.channel, 2);
  storeLE(out + 8, static_cast<uint32_t>(h.srcRank), 4);
  storeLE(out + 12, static_cast<uint32_t>(h.dstRank), 4);
  std::memcpy(out + 16, h.token.data(), h.token.size());
}

std::array<uint8_t, sizeof(Hello)> memberHello(const GroupToken& token, int srcRank, int dstRank,
                                               Channel channel) {
  Hello h{};
  h.magic = Hello::kMagic;
  h.version = Hello::kVersion;
  h.channel = static_cast<uint16_t>(channel);
  h.srcRank = srcRank;
  h.dstRank = dstRank;
  h.token = token;
  std::array<uint8_t, sizeof(Hello)> wire;
  encodeHello(h, wire.data());
  return wire;
}

const char* checkHello(const Hello& h, const HelloGroup* group) {
  if (group == nullptr) return "unknown group token";
  if (h.srcRank < 0 || h.srcRank >= group->size || h.dstRank != group->myRank)
    return "ranks out of range";
  if (h.channel != static_cast<uint16_t>(Channel::Collective) &&
      h.channel != static_cast<uint16_t>(Channel::PointToPoint) &&
      h.channel != static_cast<uint16_t>(Channel::Probe))
    return "unknown channel";
  return nullptr;
}

GroupToken randomToken() {
  GroupToken t;
  std::random_device rd;  // /dev/urandom
  for (auto& b : t) b = static_cast<uint8_t>(rd());
  return t;
}

std::string tokenToHex(const GroupToken& t) { return toHex(t.data(), t.size()); }

GroupToken tokenFromHex(const std::string& hex) {
  GroupToken t;
  if (!fromHex(hex, t.data(), t.size()))
    throw CommError(CommError::Kind::Protocol, "malformed group token");
  return t;
}

TcpListener& TcpListener::instance(const std::string& localIp) {
  // Never destroyed: the accept thread lives as long as the process.
  static TcpListener* listener = new TcpListener(localIp);
  return *listener;
}

TcpListener::TcpListener(const std::string& localIp) {
  int port = 0;
  listenFd_ = listenOn(localIp, &port);
  setNonBlocking(listenFd_, true);
  address_ = joinHostPort(localIp, port);
  SMDCCL_INFO("listening on ", address_);
  std::thread([this] { acceptLoop(); }).detach();
}

void TcpListener::registerGroup(const GroupToken& token, int groupSize, int myRank) {
  std::lock_guard<std::mutex> lock(mu_);
  Group& g = groups_[token] = Group{HelloGroup{groupSize, myRank}, {}};
  g.arrivalFd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (g.arrivalFd < 0) throwSystemError("eventfd", errno);
}

void TcpListener::unregisterGroup(const GroupToken& token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = groups_.find(token);
  if (it == groups_.end()) return;
  for (auto& [key, fd] : it->second.inbox) close(fd);
  close(it->second.arrivalFd);
  groups_.erase(it);
}

int TcpListener::arrivalFd(const GroupToken& token) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto g = groups_.find(token);
  return g == groups_.end() ? -1 : g->second.arrivalFd;
}

int TcpListener::tryTake(const GroupToken& token, int srcRank, Channel channel) {
  std::lock_guard<std::mutex> lock(mu_);
  return takeLocked(token, {srcRank, static_cast<uint16_t>(channel)});
}

int TcpListener::takeLocked(const GroupToken& token, std::pair<int, uint16_t> key) {
  auto g = groups_.find(token);
  if (g == groups_.end() || g->second.closed)
    throw CommError(CommError::Kind::Protocol, "group is shut down");
  auto it = g->second.inbox.find(key);
  if (it == g->second.inbox.end()) return -1;
  int fd = it->second;
  g->second.inbox.erase(it);
  return fd;
}

void TcpListener::closeGroup(const GroupToken& token) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = groups_.find(token);
    if (it == groups_.end()) return;
    it->second.closed = true;
    for (auto& [key, fd] : it->second.inbox) close(fd);
    it->second.inbox.clear();
  }
  cv_.notify_all();
}

int TcpListener::take(const GroupToken& token, int srcRank, Channel channel, const SocketWait& w) {
  const Deadline deadline = w.deadline;
  const std::string& what = w.what;
  const std::atomic<bool>* cancel = w.cancel;
  const PeerGoneProbe& gone = w.gone;
  std::unique_lock<std::mutex> lock(mu_);
  auto key = std::make_pair(srcRank, static_cast<uint16_t>(channel));
  while (true) {
    int fd = takeLocked(token, key);
    if (fd >= 0) return fd;
    if (cancel && cancel->load())
      throw CommError(CommError::Kind::Protocol, "shut down while waiting for " + what);
    if (deadline.expired())
      throw CommError(CommError::Kind::Timeout,
                      strCat("timed out waiting for ", what, " to connect"));
    if (gone) {  // may ask the store: not under the lock every group's accepts share
      lock.unlock();
      throwIfGone(gone);
      lock.lock();
      auto g = groups_.find(token);
      if (g == groups_.end() || g->second.closed || g->second.inbox.count(key)) continue;
    }
    // Short slices so a cancel is noticed.
    auto slice = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
    cv_.wait_until(lock, std::min(slice, deadline.at()));
  }
}

void TcpListener::onHello(int fd, const std::string& from, const uint8_t* data, size_t len) {
  HelloParse parsed = parseHello(data, len);
  const Hello& h = parsed.hello;
  const char* why = parsed.why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto g = why ? groups_.end() : groups_.find(h.token);
    if (!why) why = checkHello(h, g == groups_.end() ? nullptr : &g->second.shape);
    if (!why && h.channel == static_cast<uint16_t>(Channel::Probe)) {
      // A member that waits for this rank asks whether its process is
      // alive: the accepted connection was the answer.
      close(fd);
      return;
    }
    if (!why && g->second.closed) {
      // A member dialling a group that failed here: it learns from the
      // closed connection, and from the store, why.
      SMDCCL_INFO("closed connection from ", from, " (rank ", h.srcRank,
                  "): the group failed or was aborted on this rank");
      close(fd);
      return;
    }
    if (!why && g->second.inbox.count({h.srcRank, h.channel})) why = "duplicate connection";
    if (!why) {
      uint32_t ack = kAck;
      if (::send(fd, &ack, sizeof ack, MSG_NOSIGNAL | MSG_DONTWAIT) != sizeof ack) {
        why = "could not acknowledge";
      } else {
        g->second.inbox[{h.srcRank, h.channel}] = fd;
        uint64_t one = 1;
        ssize_t n = write(g->second.arrivalFd, &one, sizeof one);
        (void)n;  // EAGAIN: the counter is full, so it reads as readable anyway
      }
    }
  }
  if (why) {
    drop(fd, from, why);
    return;
  }
  cv_.notify_all();
}

void TcpListener::drop(int fd, const std::string& from, const char* why) {
  rejected_++;
  close(fd);
  auto now = std::chrono::steady_clock::now();
  logUnloggedDrops(now);
  if (dropsLoggedInWindow_ == 0) dropWindowStart_ = now;
  if (dropsLoggedInWindow_ < kDropWarnBurst) {
    dropsLoggedInWindow_++;
    SMDCCL_WARN("dropped connection from ", from, ": ", why);
  } else {
    dropsUnlogged_++;
    SMDCCL_INFO("dropped connection from ", from, ": ", why);
  }
}

void TcpListener::logUnloggedDrops(std::chrono::steady_clock::time_point now) {
  if (dropsLoggedInWindow_ == 0 || now - dropWindowStart_ < std::chrono::seconds(kDropWarnWindowS))
    return;
  if (dropsUnlogged_)
    SMDCCL_WARN("dropped ", dropsUnlogged_, " more connections in ", kDropWarnWindowS,
                " s, logged at INFO only (SMDCCL_DEBUG=INFO); ", rejected_.load(),
                " dropped since start");
  dropsLoggedInWindow_ = 0;
  dropsUnlogged_ = 0;
}

void TcpListener::acceptLoop() {
  struct Pending {
    int fd;
    std::string from;  // taken at accept: a peer that resets has no address later
    uint8_t hello[sizeof(Hello)];
    size_t got;
    std::chrono::steady_clock::time_point until;
  };
  std::vector<Pending> pending;
  using Clock = std::chrono::steady_clock;
  Clock::time_point acceptPausedUntil{}, lastResourceWarning{};
  while (true) {
    auto before = Clock::now();
    // While paused the listening socket is left out: its backlog waits.
    bool paused = before < acceptPausedUntil;
    std::vector<pollfd> fds{{paused ? -1 : listenFd_, POLLIN, 0}};
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    int timeoutMs = 200;
    if (paused)
      timeoutMs = static_cast<int>(
          std::chrono::duration_cast<std::chrono::milliseconds>(acceptPausedUntil - before)
              .count() +
          1);
    poll(fds.data(), fds.size(), timeoutMs);
    auto now = Clock::now();
    if (fds[0].revents & POLLIN) {
      while (true) {
        int fd = accept4(listenFd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
          int err = errno;
          if (outOfResources(err)) {
            acceptPausedUntil = now + kAcceptPause;
            if (lastResourceWarning == Clock::time_point{} ||
                now - lastResourceWarning >= kResourceWarnEvery) {
              lastResourceWarning = now;
              SMDCCL_WARN("cannot accept connections: ", std::strerror(err),
                          (err == EMFILE ? " (this process is at its open-file limit: raise "
                                           "`ulimit -n`)"
                                         : ""),
                          "; peers wait in the backlog, retrying every ", kAcceptPause.count(),
                          " ms");
            }
          }
          break;
        }
        if (pending.size() >= kMaxPending) {
          // Push out the oldest waiting connection, not the new one: a peer
          // sends its Hello at once, so only a connection that has been idle
          // longest is likely to be a stray (or a flood). Refusing the new one
          // instead let kMaxPending idle sockets lock every real peer out for
          // kHandshakeMs, again and again.
          drop(pending.front().fd, pending.front().from,
               "too many half-open connections (the oldest is dropped)");
          pending.erase(pending.begin());
        }
        pending.push_back(
            {fd, peerAddressOf(fd), {}, 0, now + std::chrono::milliseconds(kHandshakeMs)});
      }
    }
    std::vector<Pending> still;
    for (auto& p : pending) {
      ssize_t k = ::recv(p.fd, p.hello + p.got, sizeof(Hello) - p.got, MSG_DONTWAIT);
      if (k > 0) p.got += static_cast<size_t>(k);
      bool dead = k == 0 || (k < 0 && !tryAgain(errno));
      if (p.got == sizeof(Hello)) {
        onHello(p.fd, p.from, p.hello, p.got);
      } else if (dead || now > p.until) {
        drop(p.fd, p.from, dead ? "closed before a complete handshake" : "no handshake in time");
      } else {
        still.push_back(std::move(p));
      }
    }
    pending.swap(still);
    logUnloggedDrops(now);
  }
}

int connectToPeer(const std::string& peerAddress, const PairEnd& pair, const SocketWait& w) {
  std::string ip;
  int port = 0;
  splitHostPort(peerAddress, &ip, &port);
  int fd = connectTo(ip, port, w);
  auto wire = memberHello(pair.token, pair.myRank, pair.peerRank, pair.channel);
  // The handshake itself: bounded by the deadline alone.
  const SocketWait handshake{.deadline = w.deadline, .what = w.what};
  try {
    sendAll(fd, wire.data(), wire.size(), handshake);
    uint32_t ack = 0;
    recvAll(fd, &ack, sizeof ack, handshake);
    if (ack != kAck) throw CommError(CommError::Kind::Protocol, w.what + " refused the handshake");
  } catch (...) {
    close(fd);
    throw;
  }
  return fd;
}

}  // namespace smdccl
