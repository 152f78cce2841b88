#pragma once
// Everything one rank of a group needs to reach its peers: shared memory for
// ranks on its node, TCP for the rest (connected on first use), and the
// point-to-point sockets used by send/recv.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/store.h"
#include "topology/topology.h"
#include "transport/link.h"
#include "transport/listener_probe.h"
#include "transport/shm_node.h"
#include "transport/tcp_listener.h"

namespace smdccl {

struct MeshConfig {
  int rank = 0;
  int size = 1;
  Topology topology;
  std::string masterAddr;  // hint for picking the interface
  size_t shmRingBytes = 1 << 20;
  // Send/recv to a rank of this node through shared memory (else TCP).
  bool p2pByShm = true;
  // Why the group already failed or was aborted on some rank (its first
  // failure, as recorded in the store), or "". Asked while waiting for a
  // peer to connect: a peer that failed before it ever connected never will.
  // Called from the progress and send/recv threads; throttles itself.
  std::function<std::string()> groupFailed;
};

class Mesh {
 public:
  // Collective: every rank of the group constructs its Mesh at the same time.
  Mesh(KVStore& store, const MeshConfig& cfg, Deadline deadline);
  // A mesh over links made by the caller, one per peer (nullptr for this
  // rank), with this rank's doorbell that they ring: threads of one process
  // as ranks, on any topology (the in-process algorithm tests). No
  // listener, no send/recv sockets.
  Mesh(KVStore& store, const MeshConfig& cfg, std::vector<std::unique_ptr<Link>> links,
       Doorbell* myBell);
  ~Mesh();

  int rank() const { return cfg_.rank; }
  int size() const { return cfg_.size; }
  const Topology& topology() const { return cfg_.topology; }
  const std::string& tokenHex() const { return tokenHex_; }
  // Local ranks of this node, ascending (always includes this rank).
  const std::vector<int>& localRanks() const { return localRanks_; }
  // Shared-memory doorbell of this rank, if any peer is on this node.
  Doorbell* myBell() const { return shm_ ? &shm_->myBell() : givenBell_; }
  const ShmNode* shmNode() const { return shm_.get(); }
  // `peer` is on this node, and their segment has send/recv rings (none
  // when /dev/shm is too small for them).
  bool hasShmStreamTo(int peer) const {
    return shm_ && shm_->streamBytes() > 0 && peer != cfg_.rank &&
           cfg_.topology.sameNode(cfg_.rank, peer);
  }
  // This rank's send/recv messages to `peer` go through shared memory.
  bool sendsByShm(int peer) const { return cfg_.p2pByShm && hasShmStreamTo(peer); }
  // "ip:port" of this process's listener ("" for a one-rank group).
  std::string listenAddress() const { return listener_ ? listener_->address() : ""; }
  uint64_t rejectedConnections() const { return listener_ ? listener_->rejectedCount() : 0; }
  // After a failure: shuts down every TCP link, flags this rank as failed
  // in the node's shared memory and stops accepting the group's
  // connections, so that peers waiting on this rank (remote or local, linked
  // or not yet) fail at once instead of at their deadline.
  void abortLinks();

  // Collective-channel link to `peer` (not thread-safe: progress thread only).
  Link& link(int peer, Deadline deadline);
  // The socket this rank's send/recv messages to `peer` go out on, dialled
  // on first use (thread-safe); messages from `peer` come in on the one it
  // dials (acceptP2P).
  int dialP2P(int peer, Deadline deadline);
  // Without waiting: `peer`'s send/recv connection to this rank once it has
  // dialled, else -1 (throws once the group is shut down here).
  int acceptP2P(int peer);
  // Readable when a connection for this group arrives (-1: no listener).
  int p2pArrivalFd() const { return arrivalFd_; }
  // Why `peer`, which has not dialled this rank for send/recv, never will
  // (peerGone, the group failed, or its listener refuses connections), or "".
  std::string p2pSenderGone(int peer) { return connectionWaitGone(peer, /*accepting=*/true); }
  // Why `peer` is known to be gone (its process exited, or its group
  // failed: same node, from shared memory; another node, from the collective
  // connection it closed), or "" while there is no sign of it. Thread-safe.
  std::string peerGone(int peer) const;
  // Makes connection waits give up (on shutdown).
  void cancelWaits() { closing_ = true; }
  const std::atomic<bool>* cancelFlag() const { return &closing_; }

 private:
  int connectOrAccept(int peer, Channel channel, bool weConnect, Deadline deadline,
                      const PeerGoneProbe& gone = {});
  // `peer`'s listener address, waiting for it to be published, or (not
  // `waitForIt`) "" while it is not.
  std::string peerAddress(int peer, Deadline deadline, bool waitForIt = true);
  // MeshConfig::groupFailed's answer ("" without one).
  std::string groupFailed() const;
  // Why a peer on another node that has not connected to us is gone (its
  // listener refuses connections), or "". For accepting waits only: a
  // dialling wait sees the refusals itself.
  std::string listenerGone(int peer);
  // What a wait for `peer`'s connection asks between its attempts: whether
  // it is gone (peerGone), the group failed, or (accepting) its listener
  // refuses connections.
  std::string connectionWaitGone(int peer, bool accepting);

  KVStore& store_;
  MeshConfig cfg_;
  GroupToken token_;
  std::string tokenHex_;
  std::vector<int> localRanks_;
  std::shared_ptr<ShmNode> shm_;
  TcpListener* listener_ = nullptr;
  int arrivalFd_ = -1;
  std::vector<std::unique_ptr<Link>> links_;
  Doorbell* givenBell_ = nullptr;
  std::mutex p2pMu_;
  std::vector<int> p2pOut_, p2pIn_;
  std::mutex addrMu_;  // addrCache_: the progress thread and the p2p connector both dial
  std::vector<std::string> addrCache_;
  // The collective TCP link's socket per peer (-1: none yet), readable from
  // any thread (links_ belongs to the progress thread).
  std::unique_ptr<std::atomic<int>[]> collectiveFds_;
  std::atomic<bool> closing_{false};
  std::vector<std::unique_ptr<ListenerProbe>> listenerProbes_;  // per peer
};

}  // namespace smdccl
