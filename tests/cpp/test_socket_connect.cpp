// connectTo against a listener that never answers: its accept queue is full,
// so the kernel drops our SYNs, as a firewall or a blackholed host would.
// A blocking connect() would sit there for the kernel's SYN timeout (about
// 2 min); connectTo must give up at its deadline and end early when the
// peer-gone probe or the cancel flag says so.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>

#include "check.h"
#include "common/error.h"
#include "transport/socket_util.h"

using namespace smdccl;

namespace {

using Clock = std::chrono::steady_clock;

// A listener with a full accept queue (backlog 0 holds one connection that
// is never accepted). Dials to it go unanswered until the queue drains.
struct SilentListener {
  int listenFd = -1;
  int fillerFd = -1;
  int port = 0;
  SilentListener() {
    listenFd = listenOn("127.0.0.1", &port);
    ::listen(listenFd, 0);
    fillerFd = connectTo("127.0.0.1", port,
                         {.deadline = Deadline::after(std::chrono::seconds(5)), .what = "filler"});
  }
  ~SilentListener() {
    ::close(fillerFd);
    ::close(listenFd);
  }
};

double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Runs connectTo and returns the CommError it ends with (kind and message),
// or fails the test if it connects.
struct Ending {
  CommError::Kind kind = CommError::Kind::System;
  std::string message;
  double seconds = 0;
};
Ending dialExpectingFailure(int port, Deadline deadline, const std::atomic<bool>* cancel,
                            const PeerGoneProbe& gone) {
  Ending e;
  auto start = Clock::now();
  try {
    int fd = connectTo(
        "127.0.0.1", port,
        {.deadline = deadline, .what = "rank 1 (silent)", .cancel = cancel, .gone = gone});
    ::close(fd);
    CHECK(!"connectTo to a silent listener connected");
  } catch (const CommError& err) {
    e.kind = err.kind();
    e.message = err.what();
  }
  e.seconds = secondsSince(start);
  return e;
}

}  // namespace

TEST(connect_to_silent_host_ends_at_deadline) {
  SilentListener silent;
  Ending e = dialExpectingFailure(silent.port, Deadline::after(std::chrono::milliseconds(600)),
                                  nullptr, {});
  CHECK(e.kind == CommError::Kind::Timeout);
  CHECK(e.seconds >= 0.55 && e.seconds < 3.0);
  CHECK(e.message.find("rank 1 (silent)") != std::string::npos);
  CHECK(e.message.find("no answer in") != std::string::npos);
}

TEST(connect_to_silent_host_ends_when_peer_is_gone) {
  SilentListener silent;
  auto start = Clock::now();
  PeerGoneProbe gone = [&]() -> std::string {
    return secondsSince(start) > 0.3 ? "rank 1 recorded a failure" : "";
  };
  Ending e =
      dialExpectingFailure(silent.port, Deadline::after(std::chrono::seconds(60)), nullptr, gone);
  CHECK(e.kind == CommError::Kind::PeerFailure);
  CHECK(e.message == "rank 1 recorded a failure");
  CHECK(e.seconds < 3.0);
}

TEST(connect_to_silent_host_ends_when_cancelled) {
  SilentListener silent;
  std::atomic<bool> cancel{false};
  auto start = Clock::now();
  PeerGoneProbe setCancelLater = [&]() -> std::string {
    if (secondsSince(start) > 0.3) cancel = true;
    return "";
  };
  Ending e = dialExpectingFailure(silent.port, Deadline::after(std::chrono::seconds(60)), &cancel,
                                  setCancelLater);
  CHECK(e.kind == CommError::Kind::Protocol);
  CHECK(e.message.find("shut down") != std::string::npos);
  CHECK(e.seconds < 3.0);
}

TEST(connect_returns_a_blocking_socket) {
  int port = 0;
  int listenFd = listenOn("127.0.0.1", &port);
  int fd = connectTo("127.0.0.1", port,
                     {.deadline = Deadline::after(std::chrono::seconds(5)), .what = "listener"});
  CHECK(fd >= 0);
  // sendAll/recvAll work either way, but the TCP links set O_NONBLOCK
  // themselves where they want it: connectTo hands back a blocking fd.
  CHECK((fcntl(fd, F_GETFL, 0) & O_NONBLOCK) == 0);
  ::close(fd);
  ::close(listenFd);
}
