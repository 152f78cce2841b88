#include "transport/tcp_link.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/socket_util.h"

namespace smdccl {

TcpLink::TcpLink(int fd, int peerRank) : fd_(fd), peer_(peerRank) {
  setNonBlocking(fd_, true);
  tuneDataSocket(fd_);
}

TcpLink::~TcpLink() { close(fd_); }

void TcpLink::fail(const char* what, int err) const {
  if (err == 0)
    throw CommError(CommError::Kind::PeerFailure,
                    strCat("rank ", peer_, " closed its TCP connection (process exited?)"));
  throw CommError(CommError::Kind::PeerFailure,
                  strCat(what, " rank ", peer_, " over TCP failed: ", std::strerror(err)));
}

size_t TcpLink::send(const void* buf, size_t n) {
  if (n == 0) return 0;
  ssize_t k = ::send(fd_, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k >= 0) return static_cast<size_t>(k);
  if (tryAgain(errno)) return 0;
  fail("sending to", errno);
}

size_t TcpLink::recv(void* buf, size_t n) {
  if (n == 0) return 0;
  ssize_t k = ::recv(fd_, buf, n, MSG_DONTWAIT);
  if (k > 0) return static_cast<size_t>(k);
  if (k == 0) fail("receiving from", 0);
  if (tryAgain(errno)) return 0;
  fail("receiving from", errno);
}

}  // namespace smdccl
