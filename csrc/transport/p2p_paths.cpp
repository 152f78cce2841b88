// P2PEngine's paths for a peer's bytes (the loops call these): the sender
// chooses, and says so in its connection's first byte (P2PPath). Ranks of
// one node go through a shared-memory ring (unless SMDCCL_P2P_SHM=0 on the
// sender, or /dev/shm had no room for the rings), the rest over the
// connection itself. The receiver follows what the byte says.
#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "transport/mesh.h"
#include "transport/socket_util.h"
#include "transport/p2p_engine.h"

namespace smdccl {

namespace {
CommError connectionFailed(int rank) {
  return CommError(CommError::Kind::PeerFailure,
                   strCat("connection to rank ", rank, " failed: ", std::strerror(errno)));
}
}  // namespace

bool P2PEngine::announcePath(int rank, Peer& p) {
  const bool shm = mesh_.sendsByShm(rank);
  std::unique_ptr<P2PShmWriter> ring;
  if (shm)
    ring = std::make_unique<P2PShmWriter>(*mesh_.shmNode(), mesh_.rank(), rank, p.outFd,
                                          strCat("rank ", rank));
  const char path = shm ? kP2PByShm : kP2PBySocket;
  ssize_t k = ::send(p.outFd, &path, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k < 0 && tryAgain(errno)) return false;
  if (k != 1) throw connectionFailed(rank);
  p.ring = std::move(ring);
  p.announced = true;
  return true;
}

uint64_t P2PEngine::writeSocket(int rank, Peer& p) {
  Outbound& o = p.out;
  const uint64_t total = sizeof o.head + o.payloadBytes;
  uint64_t moved = 0;
  while (o.sent < total && moved < kTurnBytes) {
    // The header and the payload in one call: a small message is one segment.
    iovec iov[2];
    msghdr msg{};
    msg.msg_iov = iov;
    if (o.sent < sizeof o.head) {
      iov[msg.msg_iovlen++] = {o.head + o.sent, sizeof o.head - o.sent};
      if (o.payloadBytes) iov[msg.msg_iovlen++] = {const_cast<char*>(o.payload), o.payloadBytes};
    } else {
      iov[msg.msg_iovlen++] = {const_cast<char*>(o.payload) + (o.sent - sizeof o.head),
                               static_cast<size_t>(total - o.sent)};
    }
    ssize_t k = ::sendmsg(p.outFd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      o.sent += static_cast<uint64_t>(k);
      moved += static_cast<uint64_t>(k);
      continue;
    }
    if (k < 0 && tryAgain(errno)) break;
    throw connectionFailed(rank);
  }
  return moved;
}

uint64_t P2PEngine::writeRing(Peer& p) {
  Outbound& o = p.out;
  const uint64_t total = sizeof o.head + o.payloadBytes;
  p.ring->takeWakeUps();  // also: a receiver that closed fails the send here
  o.waitRoom = false;
  uint64_t moved = 0;
  while (o.sent < total && moved < kTurnBytes) {
    const bool head = o.sent < sizeof o.head;
    const char* at = head ? reinterpret_cast<const char*>(o.head) + o.sent
                          : o.payload + (o.sent - sizeof o.head);
    size_t k =
        p.ring->write(at, static_cast<size_t>(head ? sizeof o.head - o.sent : total - o.sent));
    if (k == 0) {
      o.waitRoom = true;
      break;
    }
    o.sent += k;
    moved += k;
  }
  return moved;
}

bool P2PEngine::learnPath(int rank, Peer& p) {
  char path = 0;
  ssize_t k = ::recv(p.inFd, &path, 1, MSG_DONTWAIT);
  if (k < 0 && tryAgain(errno)) return false;
  if (k == 0)
    throw CommError(CommError::Kind::PeerFailure, strCat("rank ", rank, " closed the connection"));
  if (k < 0) throw connectionFailed(rank);
  std::string peer = strCat("rank ", rank);
  if (path == kP2PBySocket) {
    p.source = std::make_unique<P2PSocketSource>(p.inFd, peer);
  } else if (path == kP2PByShm && mesh_.hasShmStreamTo(rank)) {
    p.source = std::make_unique<P2PShmReader>(*mesh_.shmNode(), mesh_.rank(), rank, p.inFd, peer);
  } else {
    throw CommError(CommError::Kind::Protocol,
                    strCat(peer, " opened its connection with an unknown path (byte ",
                           static_cast<int>(static_cast<unsigned char>(path)), ")"));
  }
  return true;
}

}  // namespace smdccl
