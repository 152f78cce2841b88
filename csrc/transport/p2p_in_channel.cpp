#include "transport/p2p_in_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "common/error.h"
#include "transport/mesh.h"
#include "transport/p2p_frame.h"
#include "transport/p2p_shm_stream.h"
#include "transport/socket_util.h"

namespace smdccl {

void P2PInChannel::read(Mesh& mesh, int rank, int fd, uint64_t budget, const Events& on) {
  readNow = false;
  if (!source_ && !learnPath(mesh, rank, fd)) return;
  source_->startTurn();
  while (true) {
    bool began = !reader.midMessage();
    P2PReader::Event ev = reader.read(*source_, &budget);
    if (began && reader.midMessage()) due = Deadline::after((*on.timeout)());
    if (ev == P2PReader::Event::Idle) break;
    if (ev == P2PReader::Event::Header) {
      due = Deadline::after((*on.timeout)());  // the payload follows its header
      on.header();
    }
    if (reader.complete()) on.message();
  }
  readNow = source_->readOnNow(budget);
}

// The receiver follows what the sender's first byte says (P2PPath).
bool P2PInChannel::learnPath(Mesh& mesh, int rank, int fd) {
  char path = 0;
  ssize_t k = ::recv(fd, &path, 1, MSG_DONTWAIT);
  if (k < 0 && tryAgain(errno)) return false;
  if (k == 0)
    throw CommError(CommError::Kind::PeerFailure, strCat("rank ", rank, " closed the connection"));
  if (k < 0)
    throw CommError(CommError::Kind::PeerFailure,
                    strCat("connection to rank ", rank, " failed: ", std::strerror(errno)));
  std::string peer = strCat("rank ", rank);
  if (path == kP2PBySocket) {
    source_ = std::make_unique<P2PSocketSource>(fd, peer);
  } else if (path == kP2PByShm && mesh.hasShmStreamTo(rank)) {
    source_ = std::make_unique<P2PShmReader>(*mesh.shmNode(), mesh.rank(), rank, fd, peer);
  } else {
    throw CommError(CommError::Kind::Protocol,
                    strCat(peer, " opened its connection with an unknown path (byte ",
                           static_cast<int>(static_cast<unsigned char>(path)), ")"));
  }
  return true;
}

}  // namespace smdccl
