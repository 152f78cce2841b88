// P2PEngine's helper thread, for what may block and so must not stop the
// loop: dialling a peer's listener for a send (its address may not be in
// the store yet), and asking whether a peer that has not connected while
// receives from it wait is gone (its process exited, its group failed, its
// listener refuses connections), so that they fail at once rather than at
// their deadline.
#include <chrono>

#include "common/log.h"
#include "common/own_thread.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

void P2PEngine::connector() {
  markOwnThread();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!dials_.empty()) {
      int rank = dials_.front();
      dials_.pop_front();
      lock.unlock();
      dial(rank);
      lock.lock();
      continue;
    }
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
      Later later;
      {
        std::lock_guard<std::mutex> relock(mu_);
        failPeer(r, recvFailure(r, why), later);  // wakes the loops
      }
      runLater(later);
    }
    lock.lock();
    dialCv_.wait_for(lock, std::chrono::milliseconds(100),
                     [this] { return stop_ || !dials_.empty(); });
  }
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
    int fd = mesh_.p2pSocket(rank, /*outgoing=*/true, by);
    std::lock_guard<std::mutex> lock(mu_);
    peers_[rank]->outFd = fd;
    peers_[rank]->dialing = false;
  } catch (const std::exception& e) {
    SMDCCL_WARN("send to rank ", rank, " on group '", group_, "' failed: ", e.what());
    Later later;
    {
      std::lock_guard<std::mutex> lock(mu_);
      peers_[rank]->dialing = false;
      failPeer(rank, sendFailure(rank, tag, e.what()), later);
    }
    runLater(later);
  }
  wake(Direction::Out);
}

}  // namespace smdccl
