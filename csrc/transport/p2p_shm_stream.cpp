#include "transport/p2p_shm_stream.h"

#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/socket_util.h"

namespace smdccl {

namespace {

ShmLink::Rings ringsOf(const ShmNode& node, int myRank, int peerRank) {
  int me = node.localIndex(myRank), p = node.localIndex(peerRank);
  return {&node.streamHeader(me, p)->ring,
          &node.streamHeader(p, me)->ring,
          node.streamData(me, p),
          node.streamData(p, me),
          /*peerBell=*/nullptr,
          node.streamBytes()};
}

// One wake-up byte. A full socket is fine: the other side has unread
// wake-ups and will look. False when the connection failed.
bool sendWakeUp(int fd) {
  const char b = 1;
  while (true) {
    ssize_t k = ::send(fd, &b, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;  // the request is taken: the byte must go
    return k == 1 || (k < 0 && tryAgain(errno));
  }
}

// Takes every wake-up there is; false once the connection closed (or was
// reset: the peer is gone either way).
bool drainWakeUps(int fd) {
  char buf[256];
  while (true) {
    ssize_t k = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (k > 0 || (k < 0 && errno == EINTR)) continue;
    return k < 0 && tryAgain(errno);
  }
}

// The other side asked for a wake-up (`flag`): this side's move is
// published, so the other side may sleep no longer. The fence orders that
// move before the look at the flag (a store then a load: only a full fence
// keeps them in order), pairing with the fence in the other side's request.
bool takeRequest(ShmCounter& flag) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return flag.value.load(std::memory_order_relaxed) != 0 &&
         flag.value.exchange(0, std::memory_order_relaxed) != 0;
}

void request(ShmCounter& flag) {
  flag.value.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace

P2PShmWriter::P2PShmWriter(const ShmNode& node, int myRank, int peerRank, int fd, std::string peer)
    : ring_(peerRank, ringsOf(node, myRank, peerRank)),
      hdr_(node.streamHeader(node.localIndex(myRank), node.localIndex(peerRank))),
      fd_(fd),
      peer_(std::move(peer)) {}

size_t P2PShmWriter::write(const char* data, size_t n) {
  size_t k = ring_.send(data, n);
  if (k == 0) {
    request(hdr_->wantsRoom);
    k = ring_.send(data, n);  // room freed before the reader could see the request
    if (k == 0) return 0;
  }
  if (takeRequest(hdr_->wantsData) && !sendWakeUp(fd_))
    throw CommError(CommError::Kind::PeerFailure,
                    strCat("connection to ", peer_, " failed: ", std::strerror(errno)));
  return k;
}

void P2PShmWriter::takeWakeUps() {
  if (!drainWakeUps(fd_))
    throw CommError(CommError::Kind::PeerFailure, peer_ + " closed the connection");
}

P2PShmReader::P2PShmReader(const ShmNode& node, int myRank, int peerRank, int fd, std::string peer)
    : ring_(peerRank, ringsOf(node, myRank, peerRank)),
      hdr_(node.streamHeader(node.localIndex(peerRank), node.localIndex(myRank))),
      fd_(fd),
      peer_(std::move(peer)) {}

size_t P2PShmReader::take(char* at, size_t room) {
  size_t k = ring_.recv(at, room);
  if (k == 0) {
    // Closed was noted before this look: what the writer wrote before it
    // closed is in the ring by now.
    if (closed_) throw CommError(CommError::Kind::PeerFailure, peer_ + " closed the connection");
    return 0;
  }
  // The writer is woken once half the ring is free, not at every step:
  // each wake-up costs both sides a system call and a switch. A writer that
  // has finished and closed needs none: what it wrote is read on, so a
  // failed one is no error here.
  if (ring_.unread() <= ring_.capacity() / 2 && takeRequest(hdr_->wantsRoom)) sendWakeUp(fd_);
  return k;
}

void P2PShmReader::takeWakeUps() {
  if (!closed_ && !drainWakeUps(fd_)) closed_ = true;
}

bool P2PShmReader::sleepOn() {
  request(hdr_->wantsData);
  const char* at = nullptr;
  return ring_.readable(&at) == 0;
}

}  // namespace smdccl
