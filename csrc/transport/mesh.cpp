#include "transport/mesh.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/error.h"
#include "common/log.h"
#include "transport/socket_util.h"
#include "transport/tcp_link.h"

namespace smdccl {

Mesh::Mesh(KVStore& store, const MeshConfig& cfg, Deadline deadline)
    : store_(store),
      cfg_(cfg),
      links_(cfg.size),
      p2pOut_(cfg.size, -1),
      p2pIn_(cfg.size, -1),
      addrCache_(cfg.size),
      collectiveFds_(new std::atomic<int>[static_cast<size_t>(cfg.size)]) {
  for (int r = 0; r < cfg.size; ++r) collectiveFds_[r].store(-1);
  // Rank 0 draws the group's secret; every connection must present it.
  if (cfg_.rank == 0) store_.set("smdccl/token", tokenToHex(randomToken()));
  tokenHex_ = store_.get("smdccl/token", deadline);
  token_ = tokenFromHex(tokenHex_);

  localRanks_ = cfg_.topology.localRanks(cfg_.rank);
  if (localRanks_.size() > 1)
    shm_ = std::make_shared<ShmNode>(store_,
                                     ShmNode::Members{.groupToken = tokenHex_,
                                                      .localRanks = localRanks_,
                                                      .myRank = cfg_.rank,
                                                      .ringBytes = cfg_.shmRingBytes},
                                     deadline);

  // Every group gets a listener address, even a single-node one: send/recv
  // between any two ranks goes over TCP.
  if (cfg_.size > 1) {
    listener_ = &TcpListener::instance(pickLocalAddress(cfg_.masterAddr));
    listener_->registerGroup(token_, cfg_.size, cfg_.rank);
    arrivalFd_ = listener_->arrivalFd(token_);
    store_.set(strCat("smdccl/addr/", cfg_.rank), listener_->address());
    for (int r = 0; r < cfg_.size; ++r)
      listenerProbes_.push_back(std::make_unique<ListenerProbe>(token_, cfg_.rank, r));
  }
}

Mesh::Mesh(KVStore& store, const MeshConfig& cfg, std::vector<std::unique_ptr<Link>> links,
           Doorbell* myBell)
    : store_(store),
      cfg_(cfg),
      links_(std::move(links)),
      givenBell_(myBell),
      p2pOut_(cfg.size, -1),
      p2pIn_(cfg.size, -1),
      addrCache_(cfg.size),
      collectiveFds_(new std::atomic<int>[static_cast<size_t>(cfg.size)]) {
  for (int r = 0; r < cfg.size; ++r) collectiveFds_[r].store(-1);
  links_.resize(cfg.size);
  localRanks_ = cfg_.topology.localRanks(cfg_.rank);
}

Mesh::~Mesh() {
  for (int fd : p2pOut_)
    if (fd >= 0) close(fd);
  for (int fd : p2pIn_)
    if (fd >= 0) close(fd);
  if (listener_) listener_->unregisterGroup(token_);
}

void Mesh::abortLinks() {
  for (auto& l : links_)
    if (l && l->pollFd() >= 0) shutdown(l->pollFd(), SHUT_RDWR);
  if (shm_) shm_->markFailed();
  // A peer that dials this rank from now on (its first collective or send
  // to this rank) is refused instead of being left waiting for data that
  // will never come; connections not yet taken are closed.
  if (listener_) listener_->closeGroup(token_);
}

std::string Mesh::peerAddress(int peer, Deadline deadline, bool waitForIt) {
  {
    std::lock_guard<std::mutex> lock(addrMu_);
    if (!addrCache_[peer].empty()) return addrCache_[peer];
  }
  std::string key = strCat("smdccl/addr/", peer);
  if (!waitForIt && !store_.check(key)) return "";
  // The progress thread (collective links) and the p2p connector may ask
  // at once: both read the same value; the store wait is outside the lock.
  std::string addr = store_.get(key, deadline);
  std::lock_guard<std::mutex> lock(addrMu_);
  addrCache_[peer] = addr;
  return addr;
}

int Mesh::connectOrAccept(int peer, Channel channel, bool weConnect, Deadline deadline,
                          const PeerGoneProbe& gone) {
  const SocketWait w{
      .deadline = deadline, .what = strCat("rank ", peer), .cancel = &closing_, .gone = gone};
  if (weConnect)
    return connectToPeer(
        peerAddress(peer, deadline),
        {.token = token_, .myRank = cfg_.rank, .peerRank = peer, .channel = channel}, w);
  return listener_->take(token_, peer, channel, w);
}

std::string Mesh::groupFailed() const { return cfg_.groupFailed ? cfg_.groupFailed() : ""; }

std::string Mesh::listenerGone(int peer) {
  if (!listener_ || cfg_.topology.sameNode(cfg_.rank, peer)) return "";
  // Not published yet: nothing to ask (and no waiting on the store here).
  return listenerProbes_[peer]->check([this, peer] {
    return peerAddress(peer, Deadline::after(std::chrono::seconds(1)), /*waitForIt=*/false);
  });
}

std::string Mesh::connectionWaitGone(int peer, bool accepting) {
  std::string why = peerGone(peer);
  if (why.empty()) why = groupFailed();
  if (why.empty() && accepting) why = listenerGone(peer);
  return why;
}

std::string Mesh::peerGone(int peer) const {
  if (shm_ && cfg_.topology.sameNode(cfg_.rank, peer)) return shm_->peerGone(peer);
  int fd = collectiveFds_[peer].load(std::memory_order_acquire);
  if (fd < 0) return "";
  // Peeks at the connection's state only: nothing is read.
  pollfd p{fd, POLLRDHUP, 0};
  if (poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)))
    return strCat("rank ", peer,
                  " closed its connection (its process exited, or a collective "
                  "failed there)");
  return "";
}

Link& Mesh::link(int peer, Deadline deadline) {
  if (!links_[peer]) {
    if (shm_ && cfg_.topology.sameNode(cfg_.rank, peer)) {
      links_[peer] = std::make_unique<ShmLink>(shm_, cfg_.rank, peer);
    } else {
      // The lower rank dials, the higher one accepts: one socket per pair.
      bool weConnect = cfg_.rank < peer;
      int fd =
          connectOrAccept(peer, Channel::Collective, weConnect, deadline,
                          [this, peer, weConnect] { return connectionWaitGone(peer, !weConnect); });
      links_[peer] = std::make_unique<TcpLink>(fd, peer);
      collectiveFds_[peer].store(fd, std::memory_order_release);
      SMDCCL_INFO("TCP link to rank ", peer, " (", peerAddressOf(fd), ")");
    }
  }
  return *links_[peer];
}

int Mesh::acceptP2P(int peer) {
  if (!listener_) return -1;
  {
    std::lock_guard<std::mutex> lock(p2pMu_);
    if (p2pIn_[peer] >= 0) return p2pIn_[peer];
  }
  int fd = listener_->tryTake(token_, peer, Channel::PointToPoint);
  if (fd < 0) return -1;
  tuneDataSocket(fd);
  std::lock_guard<std::mutex> lock(p2pMu_);
  p2pIn_[peer] = fd;
  return fd;
}

int Mesh::dialP2P(int peer, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lock(p2pMu_);
    if (p2pOut_[peer] >= 0) return p2pOut_[peer];
  }
  // Each direction has its own socket, dialled by the sender, so that sends
  // never wait for the receiver to be set up first. Only one thread dials a
  // given peer, so connecting needs no lock; holding one here would let two
  // ranks' receivers block each other's senders.
  // A peer that is gone, or whose group failed, never accepts: notice that
  // instead of waiting for the deadline.
  int fd = connectOrAccept(peer, Channel::PointToPoint, /*weConnect=*/true, deadline,
                           [this, peer] { return connectionWaitGone(peer, /*accepting=*/false); });
  tuneDataSocket(fd);
  std::lock_guard<std::mutex> lock(p2pMu_);
  p2pOut_[peer] = fd;
  return fd;
}

}  // namespace smdccl
