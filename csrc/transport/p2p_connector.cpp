// P2PEngine's part of the process's connector turn (p2p_loops.h), for what
// may block and so must not stop the loops: dialling a peer's listener for
// a send (its address may not be in the store yet; each dial on a
// short-lived thread of its own), and asking whether a peer that has not
// connected while receives from it wait is gone (its process exited, its
// group failed, its listener refuses connections), so that they fail at
// once rather than at their deadline.
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "common/own_thread.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

void P2PEngine::connectorTurn(Later& later) {
  std::vector<std::thread> ended;
  std::unique_lock<std::mutex> lock(mu_);
  for (int r : dialed_) {
    ended.push_back(std::move(dialers_[r]));
    dialers_.erase(r);
  }
  dialed_.clear();
  lock.unlock();
  for (std::thread& t : ended) t.join();  // each has just said it ended
  lock.lock();
  if (stop_) return;
  // Each dial on a short-lived thread of its own: a peer that hangs in
  // the handshake (stopped, swapping) holds up no other peer's sends.
  std::deque<int> busy;  // peers whose last dial's thread is not joined yet
  for (; !dials_.empty(); dials_.pop_front()) {
    int r = dials_.front();
    if (dialers_.count(r)) {
      busy.push_back(r);
      continue;
    }
    dialers_[r] = std::thread([this, r] {
      markOwnThread();
      dial(r);
      std::lock_guard<std::mutex> relock(mu_);
      dialed_.push_back(r);
      wakeConnector();
    });
  }
  dials_.insert(dials_.end(), busy.begin(), busy.end());
  probeSilentPeers(lock, later);
}

void P2PEngine::probeSilentPeers(std::unique_lock<std::mutex>& lock, Later& later) {
  std::vector<int> silent;
  for (int r = 0; r < mesh_.size(); ++r) {
    const Peer& p = *peers_[r];
    if (r != mesh_.rank() && p.reading && p.inFd < 0 && !p.failed &&
        (!p.recvs.empty() || !anyRecvs_.empty()))
      silent.push_back(r);
  }
  lock.unlock();
  for (int r : silent) {
    std::string why = mesh_.p2pSenderGone(r);  // may ask the store or dial a probe
    if (why.empty()) continue;
    {
      std::lock_guard<std::mutex> relock(mu_);
      Peer& p = *peers_[r];
      if (p.failed || p.inFd >= 0) continue;  // the receiving loop took its connection meanwhile
      // A peer that connected, sent and exited is gone, but what it sent
      // is here to be read.
      int fd = -1;
      try {
        fd = mesh_.acceptP2P(r);
      } catch (const std::exception&) {
        // The group is shut down here: fail the peer as below.
      }
      if (fd >= 0) {
        p.inFd = fd;
        wake(Direction::In);
        continue;
      }
      failPeer(r, recvFailure(r, why), later);  // wakes the loops
    }
  }
  lock.lock();
}

void P2PEngine::dial(int rank) {
  Deadline by;
  int64_t tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    by = peers_[rank]->dialBy;
    tag = peers_[rank]->dialTag;
  }
  try {
    int fd = mesh_.dialP2P(rank, by);
    std::lock_guard<std::mutex> lock(mu_);
    peers_[rank]->outFd = fd;
    peers_[rank]->dialing = false;
  } catch (const std::exception& e) {
    Later later;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[rank]->dialing = false;
      failSending(rank, tag, e.what(), later);
    }
    runLater(later);
  }
  wake(Direction::Out);
}

}  // namespace smdccl
