#include "transport/tcp_link.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/reduce.h"
#include "transport/socket_util.h"

namespace smdccl {

namespace {
constexpr size_t kStaging = 256 << 10;
}

TcpLink::TcpLink(int fd, int peerRank) : fd_(fd), peer_(peerRank), staging_(new char[kStaging]) {
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
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("sending to", errno);
}

size_t TcpLink::recv(void* buf, size_t n) {
  if (n == 0) return 0;
  ssize_t k = ::recv(fd_, buf, n, MSG_DONTWAIT);
  if (k > 0) return static_cast<size_t>(k);
  if (k == 0) fail("receiving from", 0);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
  fail("receiving from", errno);
}

size_t TcpLink::recvReduce(void* dst, size_t n, DType dtype, RedOp op) {
  size_t es = elementSize(dtype);
  size_t want = std::min(n, kStaging) - stagingFill_;
  size_t got = recv(staging_.get() + stagingFill_, want);
  stagingFill_ += got;
  size_t whole = stagingFill_ / es * es;
  if (whole == 0) return 0;
  reduceInto(dst, staging_.get(), whole / es, dtype, op);
  stagingFill_ -= whole;
  if (stagingFill_) std::memmove(staging_.get(), staging_.get() + whole, stagingFill_);
  return whole;
}

}  // namespace smdccl
