// P2PEngine's part of the process's connector turn (p2p_loops.h), for what
// may block and so must not stop the loops, each on a short-lived thread of
// the engine's own so that one group's slow peer holds up no other group:
// dialling a peer's listener for a send (its address may not be in the
// store yet; a thread per dial), and asking whether a peer that has not
// connected while receives from it wait is gone (its process exited, its
// group failed, its listener refuses connections), so that they fail at
// once rather than at their deadline. Those threads hand their completions
// to the connector's next turn: one that drops the last reference to the
// group must not run on a thread the engine joins.
#include <chrono>
#include <map>
#include <thread>
#include <vector>

#include "common/log.h"
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
  if (probed_) {
    ended.push_back(std::move(prober_));
    probed_ = false;
  }
  for (auto& f : handedOver_) later.push_back(std::move(f));
  handedOver_.clear();
  lock.unlock();
  for (std::thread& t : ended) t.join();  // each has just said it ended
  lock.lock();
  if (stop_) return;
  startDials();
  startProbe();
}

void P2PEngine::startDials() {
  // A peer whose last dial's thread is not joined yet waits for a later
  // turn (its end pokes the connector).
  std::deque<int> asked;
  asked.swap(dials_);
  for (int r : asked) {
    bool started = false;
    if (!dialers_.count(r)) {
      try {
        dialers_[r] = std::thread([this, r] {
          markOwnThread("smdccl-p2p-dial");
          dial(r);
          std::lock_guard<std::mutex> relock(mu_);
          dialed_.push_back(r);
          wakeConnector();
        });
        started = true;
      } catch (const std::exception& e) {  // no thread now (a limit): a later turn
        dialers_.erase(r);
        SMDCCL_WARN("send/recv on group '", group_, "': no thread to dial rank ", r, ": ",
                    e.what());
      }
    }
    if (!started) dials_.push_back(r);
  }
}

bool P2PEngine::silent(int rank) const {
  const Peer& p = *peers_[rank];
  return rank != mesh_.rank() && p.reading && p.inFd < 0 && !p.failed &&
         (!p.recvs.empty() || !anyRecvs_.empty());
}

void P2PEngine::startProbe() {
  // One at a time, at most every 100 ms (the connector's turn, as before);
  // each probe throttles its own store and listener questions.
  auto now = Clock::now();
  if (prober_.joinable() || now - lastProbe_ < std::chrono::milliseconds(100)) return;
  bool any = false;
  for (int r = 0; r < mesh_.size() && !any; ++r) any = silent(r);
  if (!any) return;
  try {
    prober_ = std::thread([this] {
      markOwnThread("smdccl-p2p-peek");
      probeSilentPeers();
      std::lock_guard<std::mutex> relock(mu_);
      probed_ = true;  // joined by a later turn
    });
    lastProbe_ = now;
  } catch (const std::exception&) {
    // No thread now (a limit): the next turn tries again, and the
    // receives' own deadlines still hold.
  }
}

void P2PEngine::handOver(Later& later) {
  if (later.empty()) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& f : later) handedOver_.push_back(std::move(f));
  later.clear();
  wakeConnector();
}

void P2PEngine::probeSilentPeers() {
  std::vector<int> quiet;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r = 0; r < mesh_.size(); ++r)
      if (silent(r)) quiet.push_back(r);
  }
  Later later;
  for (int r : quiet) {
    std::string why = mesh_.p2pSenderGone(r);  // may ask the store or dial a probe
    if (why.empty()) continue;
    std::lock_guard<std::mutex> lock(mu_);
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
  handOver(later);
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
    handOver(later);
  }
  wake(Direction::Out);
}

}  // namespace smdccl
