#include "transport/p2p_out_channel.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/mesh.h"
#include "transport/socket_util.h"

namespace smdccl {

void P2POutChannel::start(P2PSend r) {
  clear();
  active = true;
  req = std::move(r);
}

void P2POutChannel::clear() {
  active = ready = connected = waitRoom = warned = false;
  req = P2PSend{};
  notReady = nullptr;
  sent = payloadBytes = 0;
  lastMoved = Clock::time_point{};
  payload_ = nullptr;
  report_.clear();
}

void P2POutChannel::pollReady() {
  // A local failure before the data is there (the GPU copy) fails this send
  // only: the receiver gets why in place of the data and fails the matching
  // receive (instead of waiting for it, or taking the next message of the
  // tag); the link stays in step.
  try {
    ready = !req.ready || req.ready();
  } catch (const std::exception& e) {
    notReady = std::current_exception();
    report_ = e.what();
    ready = true;
  } catch (...) {
    notReady = std::current_exception();
    report_ = "an exception of unknown type";
    ready = true;
  }
  if (!ready) return;
  P2PHeader h{P2PHeader::kMagic, req.flags, req.tag, req.bytes};
  payload_ = static_cast<const char*>(req.buf);
  if (notReady) {
    h.flags = P2PHeader::kSenderFailed;
    h.bytes = report_.size();
    payload_ = report_.data();
  }
  payloadBytes = h.bytes;
  encodeP2PHeader(h, head);
}

namespace {
CommError connectionFailed(int rank) {
  return CommError(CommError::Kind::PeerFailure,
                   strCat("connection to rank ", rank, " failed: ", std::strerror(errno)));
}
}  // namespace

uint64_t P2POutChannel::move(Mesh& mesh, int rank, int fd) {
  if (!announced_ && !announce(mesh, rank, fd)) return 0;
  return ring_ ? writeRing() : writeSocket(rank, fd);
}

// Ranks of one node go through a shared-memory ring (unless SMDCCL_P2P_SHM=0
// on the sender, or /dev/shm had no room for the rings), the rest over the
// connection itself; the receiver follows what the byte says.
bool P2POutChannel::announce(Mesh& mesh, int rank, int fd) {
  const bool shm = mesh.sendsByShm(rank);
  std::unique_ptr<P2PShmWriter> ring;
  if (shm)
    ring = std::make_unique<P2PShmWriter>(*mesh.shmNode(), mesh.rank(), rank, fd,
                                          strCat("rank ", rank));
  const char path = shm ? kP2PByShm : kP2PBySocket;
  ssize_t k = ::send(fd, &path, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (k < 0 && tryAgain(errno)) return false;
  if (k != 1) throw connectionFailed(rank);
  ring_ = std::move(ring);
  announced_ = true;
  return true;
}

uint64_t P2POutChannel::writeSocket(int rank, int fd) {
  const uint64_t total = sizeof head + payloadBytes;
  uint64_t moved = 0;
  while (sent < total && moved < kTurnBytes) {
    // The header and the payload in one call: a small message is one segment.
    iovec iov[2];
    msghdr msg{};
    msg.msg_iov = iov;
    if (sent < sizeof head) {
      iov[msg.msg_iovlen++] = {head + sent, sizeof head - sent};
      if (payloadBytes) iov[msg.msg_iovlen++] = {const_cast<char*>(payload_), payloadBytes};
    } else {
      iov[msg.msg_iovlen++] = {const_cast<char*>(payload_) + (sent - sizeof head),
                               static_cast<size_t>(total - sent)};
    }
    ssize_t k = ::sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k > 0) {
      sent += static_cast<uint64_t>(k);
      moved += static_cast<uint64_t>(k);
      continue;
    }
    if (k < 0 && tryAgain(errno)) break;
    throw connectionFailed(rank);
  }
  return moved;
}

uint64_t P2POutChannel::writeRing() {
  const uint64_t total = sizeof head + payloadBytes;
  ring_->takeWakeUps();  // also: a receiver that closed fails the send here
  waitRoom = false;
  uint64_t moved = 0;
  while (sent < total && moved < kTurnBytes) {
    const bool inHead = sent < sizeof head;
    const char* at =
        inHead ? reinterpret_cast<const char*>(head) + sent : payload_ + (sent - sizeof head);
    size_t k = ring_->write(at, static_cast<size_t>(inHead ? sizeof head - sent : total - sent));
    if (k == 0) {
      waitRoom = true;
      break;
    }
    sent += k;
    moved += k;
  }
  return moved;
}

}  // namespace smdccl
