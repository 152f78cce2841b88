// P2PEngine's posting side: send / recv / recvAny queue their request (or a
// receive completes at once from a message that arrived first), matching,
// and failing a peer. The loop that moves the bytes: p2p_loop.cpp.
#include "transport/p2p_engine.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "transport/mesh.h"

namespace smdccl {

P2PEngine::P2PEngine(Mesh& mesh, std::string groupName,
                     std::function<std::chrono::milliseconds()> timeout, double warnAfterS)
    : mesh_(mesh),
      group_(std::move(groupName)),
      timeout_(std::move(timeout)),
      // Off unless a sane positive number of seconds (NaN, inf, 1e10 would
      // overflow the clock arithmetic below).
      warnAfterS_(warnAfterS > 0 && warnAfterS <= 1e7 ? warnAfterS : 0) {
  for (int r = 0; r < mesh_.size(); ++r) peers_.push_back(std::make_unique<Peer>());
}

P2PEngine::~P2PEngine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  mesh_.cancelWaits();  // a dial in progress gives up
  if (P2PLoops* loops = liveLoops()) loops->detach(this);
  // No connector turn starts a thread now (stop_): join those running.
  std::map<int, std::thread> dialers;
  std::thread prober;
  {
    std::lock_guard<std::mutex> lock(mu_);
    dialers.swap(dialers_);
    prober.swap(prober_);
  }
  for (auto& [rank, t] : dialers) t.join();
  if (prober.joinable()) prober.join();
  // What is left must not wait for ever (a wait() without a timeout on a
  // work of a destroyed group).
  auto gone = std::make_exception_ptr(CommError(
      CommError::Kind::System,
      strCat("smdccl: group '", group_, "' was destroyed before this send/recv completed")));
  Later later;
  {
    std::lock_guard<std::mutex> lock(mu_);
    later.swap(handedOver_);
    for (int r = 0; r < mesh_.size(); ++r) {
      failPeer(r, gone, later);
      endOut(*peers_[r], later);
      endIn(r, *peers_[r], later);
    }
    for (RecvReq& req : anyRecvs_) finishLater(later, std::move(req), -1, gone);
    anyRecvs_.clear();
  }
  runP2PLater(later);
}

void P2PEngine::attachLoops() {
  if (stop_ || liveLoops()) return;
  P2PLoops& loops = P2PLoops::instance();
  loops.attach(this);
  loops_ = &loops;
}

P2PLoops* P2PEngine::liveLoops() const {
  P2PLoops* loops = loops_.load();
  return loops && loops == P2PLoops::current() ? loops : nullptr;
}

void P2PEngine::wake(Direction d) {
  if (P2PLoops* loops = liveLoops()) loops->wake(d);
}

void P2PEngine::wakeConnector() {
  if (P2PLoops* loops = liveLoops()) loops->wakeConnector();
}

void P2PEngine::wakeBoth() {
  wake(Direction::Out);
  wake(Direction::In);
}

void P2PEngine::abort(std::exception_ptr why) {
  Later later;
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = why;
    // Also with no peer reading yet: an any-source receive must not wait.
    if (!anyFailed_) anyFailed_ = why;
    for (RecvReq& req : anyRecvs_) finishLater(later, std::move(req), -1, why);
    anyRecvs_.clear();
    for (int r = 0; r < mesh_.size(); ++r)
      if (r != mesh_.rank()) failPeer(r, why, later);
    failOwnRecvs(why, later);
  }
  wakeBoth();  // the loops end what they have in flight
  runP2PLater(later);
}

void P2PEngine::send(int rank, Outgoing m) {
  if (rank == mesh_.rank()) return sendToSelf(std::move(m));
  std::unique_lock<std::mutex> lock(mu_);
  attachLoops();  // first: a request is queued only where loops serve it
  Peer& p = *peers_[rank];
  if (p.failed) {
    std::exception_ptr e = p.failed;
    lock.unlock();
    m.done(e);
    return;
  }
  p.sends.push_back(std::move(m));
  lock.unlock();
  wake(Direction::Out);
}

void P2PEngine::sendToSelf(Outgoing m) {
  // No loop moves it: a CUDA send's copy to host is waited for here, by
  // the send's deadline; if it fails, the receive is told why, as from a peer.
  Arrived msg{{}, 0, 0};
  std::exception_ptr notSent;
  try {
    for (int polls = 0; m.ready && !m.ready(); ++polls) {
      if (m.deadline.expired())
        throw CommError(CommError::Kind::Timeout, "its data was not ready by the send's deadline");
      std::this_thread::sleep_for(std::chrono::microseconds(polls < 100 ? 1 : 50));
    }
    const char* data = static_cast<const char*>(m.buf);
    msg.payload.assign(data, data + m.bytes);
    msg.flags = m.flags;
  } catch (const std::exception& e) {
    notSent = std::current_exception();
    msg.payload.assign(e.what(), e.what() + std::strlen(e.what()));
    msg.flags = P2PHeader::kSenderFailed;
  }
  const int me = mesh_.rank();
  std::unique_lock<std::mutex> lock(mu_);
  if (aborted_) {
    lock.unlock();
    m.done(aborted_);
    return;
  }
  // The oldest receive from this rank of the tag takes it, else it waits
  // for one (any-source receives wait for the other ranks, as gloo's).
  Peer& p = *peers_[me];
  RecvReq req;
  if (!takeMatch(p, m.tag, &req, /*anySource=*/false)) {
    msg.arrived = nextArrival_++;
    p.early[m.tag].push_back(std::move(msg));
    lock.unlock();
  } else {
    lock.unlock();
    completeFromBuffer(group_, me, req, msg);
  }
  m.done(notSent);
}

void P2PEngine::recv(int rank, Incoming m) {
  std::unique_lock<std::mutex> lock(mu_);
  attachLoops();  // first: a request is queued only where loops serve it
  Peer& p = *peers_[rank];
  RecvReq req{m.buf, m.bytes, m.tag, m.deadline, std::move(m.done), nextPost_++, nullptr};
  // A message that arrived before its peer closed the connection (it sent,
  // then exited) is still delivered; after abort() nothing is.
  auto early = aborted_ ? p.early.end() : p.early.find(m.tag);
  if (p.failed && early == p.early.end()) {
    std::exception_ptr e = p.failed;
    lock.unlock();
    finish(req, rank, e);
    return;
  }
  // No any-source receive of this tag is pending when a message of it waits
  // here: that receive would have taken it on arrival.
  if (early != p.early.end()) {
    Arrived msg = takeEarly(p, early);
    lock.unlock();
    completeFromBuffer(group_, rank, req, msg);
    return;
  }
  p.recvs.push_back(std::move(req));
  if (rank == mesh_.rank()) return;  // sendToSelf takes it; the loop only expires it
  // The receiving loop starts on a peer at its first receive; after that
  // the message's arrival wakes it, and its deadline is within its
  // 100 ms turn.
  bool first = !p.reading;
  p.reading = true;
  lock.unlock();
  if (first) wake(Direction::In);
}

void P2PEngine::recvAny(Incoming m, std::function<void(int)> source) {
  std::unique_lock<std::mutex> lock(mu_);
  attachLoops();  // first: a request is queued only where loops serve it
  RecvReq req{m.buf, m.bytes, m.tag, m.deadline, std::move(m.done), nextPost_++, std::move(source)};
  if (aborted_) {
    std::exception_ptr failed = aborted_;
    lock.unlock();
    finish(req, -1, failed);
    return;
  }
  // The oldest message of the tag that has already arrived, from any peer
  // (also one whose connection has closed since).
  int from = -1;
  EarlyMap::iterator queue;
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    auto it = peers_[r]->early.find(m.tag);
    if (it == peers_[r]->early.end()) continue;
    if (from < 0 || it->second.front().arrived < queue->second.front().arrived) {
      queue = it;
      from = r;
    }
  }
  if (from >= 0) {
    Arrived msg = takeEarly(*peers_[from], queue);
    lock.unlock();
    completeFromBuffer(group_, from, req, msg);
    return;
  }
  if (anyFailed_) {
    std::exception_ptr failed = anyFailed_;
    lock.unlock();
    finish(req, -1, failed);
    return;
  }
  anyRecvs_.push_back(std::move(req));
  bool first = false;
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank() || peers_[r]->reading) continue;
    peers_[r]->reading = first = true;
  }
  lock.unlock();
  if (first) wake(Direction::In);
}

P2PEngine::Arrived P2PEngine::takeEarly(Peer& p, EarlyMap::iterator it) {
  Arrived msg = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) p.early.erase(it);  // tags come and go: keep the map small
  return msg;
}

bool P2PEngine::takeMatch(Peer& p, int64_t tag, RecvReq* out, bool anySource) {
  auto hasTag = [tag](const RecvReq& r) { return r.tag == tag; };
  auto own = std::find_if(p.recvs.begin(), p.recvs.end(), hasTag);
  auto any = anySource ? std::find_if(anyRecvs_.begin(), anyRecvs_.end(), hasTag) : anyRecvs_.end();
  bool useOwn = own != p.recvs.end();
  bool useAny = any != anyRecvs_.end();
  if (useOwn && useAny) (own->posted < any->posted ? useAny : useOwn) = false;
  if (useOwn) {
    *out = std::move(*own);
    p.recvs.erase(own);
  } else if (useAny) {
    *out = std::move(*any);
    anyRecvs_.erase(any);
  }
  return useOwn || useAny;
}

void P2PEngine::finish(RecvReq& req, int rank, std::exception_ptr err) {
  if (req.source && rank >= 0) req.source(rank);
  req.done(err);
}

void P2PEngine::finishLater(Later& later, RecvReq req, int rank, std::exception_ptr err) {
  later.push_back([r = std::move(req), rank, err]() mutable { finish(r, rank, err); });
}

void P2PEngine::completeFromBuffer(const std::string& group, int rank, RecvReq& req,
                                   const Arrived& msg) {
  if (P2PHeader::carriesReport(msg.flags)) {
    failFromSender(group, rank, req, msg.flags, msg.payload);
    return;
  }
  if (msg.payload.size() != req.bytes) {
    finish(req, rank, std::make_exception_ptr(sizeMismatch(group, rank, req, msg.payload.size())));
    return;
  }
  if (req.bytes) std::memcpy(req.buf, msg.payload.data(), req.bytes);
  finish(req, rank, nullptr);
}

void P2PEngine::failFromSender(const std::string& group, int rank, RecvReq& req, uint32_t flags,
                               const std::vector<char>& report) {
  std::string head =
      strCat("smdccl: recv from rank ", rank, " (tag ", req.tag, ") on group '", group, "': ");
  std::string why(report.begin(), report.end());
  if (flags & P2PHeader::kNonFinite)
    finish(req, rank,
           std::make_exception_ptr(InvalidArgument(strCat(head, "SMDCCL_NAN_CHECK: rank ", rank,
                                                          " did not send its tensor: ", why,
                                                          ". This tensor was left as it was"))));
  else  // the link is fine: only this message is lost
    finish(req, rank,
           std::make_exception_ptr(
               CommError(CommError::Kind::PeerFailure,
                         strCat(head, "rank ", rank, " could not send its tensor: ", why,
                                ". This tensor was left as it was"))));
}

InvalidArgument P2PEngine::sizeMismatch(const std::string& group, int rank, const RecvReq& req,
                                        uint64_t sent) {
  return InvalidArgument(strCat("smdccl: recv from rank ", rank, " with tag ", req.tag,
                                " on group '", group, "' expected ", req.bytes,
                                " bytes but the matching send carried ", sent));
}

void P2PEngine::failSending(int rank, int64_t tag, const std::string& why, Later& later) {
  SMDCCL_WARN("send to rank ", rank, " on group '", group_, "' failed: ", why);
  failPeer(rank,
           std::make_exception_ptr(CommError(CommError::Kind::PeerFailure,
                                             strCat("smdccl: send to rank ", rank, " (tag ", tag,
                                                    ") on group '", group_, "' failed: ", why))),
           later);
}

std::exception_ptr P2PEngine::recvFailure(int rank, const std::string& why) const {
  return std::make_exception_ptr(
      CommError(CommError::Kind::PeerFailure,
                strCat("smdccl: recv from rank ", rank, " on group '", group_, "': ", why)));
}

void P2PEngine::failOwnRecvs(std::exception_ptr e, Later& later) {
  Peer& self = *peers_[mesh_.rank()];
  for (RecvReq& r : self.recvs) finishLater(later, std::move(r), -1, e);
  self.recvs.clear();
}

void P2PEngine::failPeer(int rank, std::exception_ptr e, Later& later) {
  Peer& p = *peers_[rank];
  if (!p.failed) {
    p.failed = e;  // the first cause (e.g. abort()) names it for good
    ++failedPeers_;
  }
  e = p.failed;
  wakeBoth();  // the loops end what they have in flight for it
  for (Outgoing& s : p.sends) later.push_back([s = std::move(s), e] { s.done(e); });
  p.sends.clear();
  for (RecvReq& r : p.recvs) finishLater(later, std::move(r), -1, e);
  p.recvs.clear();
  // Any-source receives wait on while some rank could still send (one that
  // finished and exited must not fail them); with none left, fail.
  if (failedPeers_ >= mesh_.size() - 1) {
    if (!anyFailed_) anyFailed_ = e;
    for (RecvReq& r : anyRecvs_) finishLater(later, std::move(r), -1, e);
    anyRecvs_.clear();
  }
}

}  // namespace smdccl
