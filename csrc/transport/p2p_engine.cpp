#include "transport/p2p_engine.h"

#include <cstdint>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/exit_fence.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "transport/mesh.h"
#include "transport/socket_util.h"

namespace smdccl {

SocketWait P2PEngine::payloadWait(const std::string& what) const {
  return {.deadline = Deadline::after(timeout_()), .what = what, .cancel = mesh_.cancelFlag()};
}

P2PEngine::P2PEngine(Mesh& mesh, std::string groupName,
                     std::function<std::chrono::milliseconds()> timeout, double warnAfterS)
    : mesh_(mesh),
      group_(std::move(groupName)),
      timeout_(std::move(timeout)),
      // Off unless a sane positive number of seconds (NaN, inf, 1e10 would
      // overflow the clock arithmetic below).
      warnAfterS_(warnAfterS > 0 && warnAfterS <= 1e7 ? warnAfterS : 0) {}

P2PEngine::~P2PEngine() {
  stop_ = true;
  mesh_.cancelWaits();
  matchCv_.notify_all();
  for (auto& [rank, p] : peers_) {
    p->cv.notify_all();
    if (p->sender.joinable()) p->sender.join();
    if (p->receiver.joinable()) p->receiver.join();
  }
  // What the threads left queued must not wait for ever (a wait() without
  // a timeout on a work of a destroyed group).
  auto gone = std::make_exception_ptr(CommError(
      CommError::Kind::System,
      strCat("smdccl: group '", group_, "' was destroyed before this send/recv completed")));
  for (auto& [rank, p] : peers_) {
    for (auto& snd : p->sends) snd.done(gone);
    dropOrLeak(p->sends);
    failRecvs(p->recvs, gone);
  }
  failRecvs(anyRecvs_, gone);
}

P2PEngine::Peer& P2PEngine::peer(int rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& p = peers_[rank];
  if (!p) {
    p = std::make_unique<Peer>();
    p->failed = aborted_;
  }
  return *p;
}

void P2PEngine::abort(std::exception_ptr why) {
  std::vector<Peer*> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_ = why;
    for (auto& [rank, p] : peers_) all.push_back(p.get());
  }
  std::deque<RecvReq> anys;
  {
    // Also with no peer yet: an any-source receive must not wait for one.
    std::lock_guard<std::mutex> match(matchMu_);
    if (!anyFailed_) anyFailed_ = why;
    anys.swap(anyRecvs_);
  }
  failRecvs(anys, why);
  for (Peer* p : all) failAll(*p, why);
}

void P2PEngine::send(int rank, Outgoing m) {
  Peer& p = peer(rank);
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.failed) {
    m.done(p.failed);
    return;
  }
  p.sends.push_back({nextSendId_++, m.buf, m.bytes, m.tag, m.deadline, std::move(m.done),
                     std::move(m.ready), m.flags});
  if (!p.sender.joinable()) p.sender = std::thread([this, rank, &p] { senderLoop(rank, p); });
  p.cv.notify_all();
}

void P2PEngine::recv(int rank, Incoming m) {
  Peer& p = peer(rank);
  const int64_t tag = m.tag;
  RecvReq req{m.buf, m.bytes, m.tag, m.deadline, std::move(m.done), nextPost_++, nullptr};
  std::unique_lock<std::mutex> match(matchMu_);
  std::exception_ptr failed;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    failed = p.failed;
  }
  if (failed) {
    match.unlock();
    finish(req, rank, failed);
    return;
  }
  // No any-source receive of this tag is pending when a message of it waits
  // here: that receive would have taken it on arrival.
  auto early = p.early.find(tag);
  if (early != p.early.end()) {
    Arrived msg = takeEarly(p, early);
    match.unlock();
    completeFromBuffer(rank, req, msg);
    return;
  }
  p.recvs.push_back(std::move(req));
  {
    std::lock_guard<std::mutex> lock(p.mu);
    ensureReceiver(rank, p);
  }
  matchCv_.notify_all();
}

void P2PEngine::recvAny(Incoming m, std::function<void(int)> source) {
  const int64_t tag = m.tag;
  RecvReq req{m.buf, m.bytes, m.tag, m.deadline, std::move(m.done), nextPost_++, std::move(source)};
  std::unique_lock<std::mutex> match(matchMu_);
  if (anyFailed_) {
    std::exception_ptr failed = anyFailed_;
    match.unlock();
    finish(req, -1, failed);
    return;
  }
  // The oldest message of the tag that has already arrived, from any peer.
  int from = -1;
  Peer* fromPeer = nullptr;
  EarlyMap::iterator queue;
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = peer(r);
    auto it = p.early.find(tag);
    if (it == p.early.end()) continue;
    if (!fromPeer || it->second.front().arrived < queue->second.front().arrived) {
      queue = it;
      fromPeer = &p;
      from = r;
    }
  }
  if (fromPeer) {
    Arrived msg = takeEarly(*fromPeer, queue);
    match.unlock();
    completeFromBuffer(from, req, msg);
    return;
  }
  anyRecvs_.push_back(std::move(req));
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = peer(r);
    std::lock_guard<std::mutex> lock(p.mu);
    ensureReceiver(r, p);
  }
  matchCv_.notify_all();
}

P2PEngine::Arrived P2PEngine::takeEarly(Peer& p, EarlyMap::iterator it) {
  Arrived msg = std::move(it->second.front());
  it->second.pop_front();
  if (it->second.empty()) p.early.erase(it);  // tags come and go: keep the map small
  return msg;
}

void P2PEngine::failRecvs(std::deque<RecvReq>& q, std::exception_ptr e) {
  for (auto& r : q) finish(r, -1, e);
  dropOrLeak(q);  // they may hold the last reference to Python's tensors
}

void P2PEngine::ensureReceiver(int rank, Peer& p) {
  if (!p.receiver.joinable() && !p.failed && !stop_)
    p.receiver = std::thread([this, rank, &p] { receiverLoop(rank, p); });
}

bool P2PEngine::takeMatch(Peer& p, int64_t tag, RecvReq* out) {
  auto hasTag = [tag](const RecvReq& r) { return r.tag == tag; };
  auto own = std::find_if(p.recvs.begin(), p.recvs.end(), hasTag);
  auto any = std::find_if(anyRecvs_.begin(), anyRecvs_.end(), hasTag);
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

void P2PEngine::completeFromBuffer(int rank, RecvReq& req, const Arrived& msg) {
  if (P2PHeader::carriesReport(msg.flags)) {
    failFromSender(rank, req, msg.flags, msg.payload);
    return;
  }
  if (msg.payload.size() != req.bytes) {
    finish(req, rank, std::make_exception_ptr(sizeMismatch(rank, req, msg.payload.size())));
    return;
  }
  if (req.bytes) std::memcpy(req.buf, msg.payload.data(), req.bytes);
  finish(req, rank, nullptr);
}

void P2PEngine::failFromSender(int rank, RecvReq& req, uint32_t flags,
                               const std::vector<char>& report) const {
  std::string head =
      strCat("smdccl: recv from rank ", rank, " (tag ", req.tag, ") on group '", group_, "': ");
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

InvalidArgument P2PEngine::sizeMismatch(int rank, const RecvReq& req, uint64_t sent) const {
  return InvalidArgument(strCat("smdccl: recv from rank ", rank, " with tag ", req.tag,
                                " on group '", group_, "' expected ", req.bytes,
                                " bytes but the matching send carried ", sent));
}

void P2PEngine::failAll(Peer& p, std::exception_ptr e) {
  std::deque<SendReq> sends;
  std::deque<RecvReq> recvs, anys;
  {
    std::lock_guard<std::mutex> match(matchMu_);
    std::lock_guard<std::mutex> lock(p.mu);
    if (!p.failed) {
      p.failed = e;  // the first cause (e.g. abort()) names it for good
      ++failedPeers_;
    }
    e = p.failed;
    sends.swap(p.sends);
    recvs.swap(p.recvs);
    // Any-source receives wait on while some rank could still send (one
    // that finished and exited must not fail them); with none left, fail.
    if (failedPeers_ >= mesh_.size() - 1) {
      if (!anyFailed_) anyFailed_ = e;
      anys.swap(anyRecvs_);
    }
  }
  for (auto& snd : sends) snd.done(e);
  dropOrLeak(sends);  // they may hold the last reference to Python's tensors
  failRecvs(recvs, e);
  failRecvs(anys, e);
}

void P2PEngine::senderLoop(int rank, Peer& p) {
  markOwnThread();
  std::string what = strCat("rank ", rank);
  int fd = -1;
  while (true) {
    SendReq req;
    {
      std::unique_lock<std::mutex> lock(p.mu);
      p.cv.wait(lock, [&] { return stop_ || !p.sends.empty(); });
      if (stop_) return;
      req = p.sends.front();
    }
    // A local failure before the data is there (the GPU copy) fails this
    // send only: the receiver gets why in place of the data and fails the
    // matching receive (instead of waiting for it, or taking the next
    // message of the tag); the link stays in step.
    std::exception_ptr notReady;
    std::string why;
    if (req.ready) {
      try {
        req.ready(req.deadline);
      } catch (const std::exception& e) {
        notReady = std::current_exception();
        why = e.what();
      } catch (...) {
        notReady = std::current_exception();
        why = "an exception of unknown type";
      }
    }
    P2PHeader head{P2PHeader::kMagic, req.flags, req.tag, req.bytes};
    const void* payload = req.buf;
    if (notReady) {
      head.flags = P2PHeader::kSenderFailed;
      head.bytes = why.size();
      payload = why.data();
    }
    try {
      if (fd < 0) fd = mesh_.p2pSocket(rank, /*outgoing=*/true, req.deadline);
      uint8_t h[sizeof(P2PHeader)];
      encodeP2PHeader(head, h);
      SendProgress progress;
      progress.total = sizeof h + head.bytes;
      sendWatched(rank, fd, req, {h, sizeof h}, &progress);
      sendWatched(rank, fd, req, {payload, head.bytes}, &progress);
    } catch (const std::exception& e) {
      SMDCCL_WARN("send to rank ", rank, " on group '", group_, "' failed: ", e.what());
      failAll(p, std::make_exception_ptr(
                     CommError(CommError::Kind::PeerFailure,
                               strCat("smdccl: send to rank ", rank, " (tag ", req.tag,
                                      ") on group '", group_, "' failed: ", e.what()))));
      return;
    }
    // failAll (the receiver failing, abort()) may have completed this
    // request and emptied the queue while it was being sent.
    bool stillQueued;
    {
      std::lock_guard<std::mutex> lock(p.mu);
      stillQueued = !p.sends.empty() && p.sends.front().id == req.id;
      if (stillQueued) p.sends.pop_front();
    }
    if (stillQueued) req.done(notReady);
    dropOrLeak(req);  // it may hold the last reference to Python's tensors
  }
}

int P2PEngine::acceptSender(int rank, Peer& p) {
  while (!stop_) {
    Deadline until = Deadline::never();
    Deadline warnAt = Deadline::never();
    {
      std::unique_lock<std::mutex> match(matchMu_);
      if (!earliestDeadline(p, &until)) {
        // Nothing this peer could complete: wait for a receive to be posted.
        matchCv_.wait_for(match, std::chrono::milliseconds(100));
        continue;
      }
      warnAt = nextWarning(p);
    }
    // Short slices: a receive posted meanwhile may be due earlier (a
    // shorter timeout, its warning).
    Deadline slice = Deadline::after(std::chrono::milliseconds(100));
    for (const Deadline& d : {until, warnAt})
      if (d.at() < slice.at()) slice = d;
    try {
      return mesh_.p2pSocket(rank, /*outgoing=*/false, slice);
    } catch (const CommError& e) {
      if (e.kind() != CommError::Kind::Timeout || stop_) throw;
      warnLate(rank, p, /*connected=*/false);
      expireLate(rank, p);  // the peer may still send later: only these receives fail
    }
  }
  return -1;
}

void P2PEngine::receiverLoop(int rank, Peer& p) {
  markOwnThread();
  std::string what = strCat("rank ", rank);
  int fd = -1;
  auto failWith = [&](const std::string& msg) {
    failAll(p, std::make_exception_ptr(CommError(
                   CommError::Kind::PeerFailure,
                   strCat("smdccl: recv from rank ", rank, " on group '", group_, "': ", msg))));
  };
  try {
    fd = acceptSender(rank, p);
  } catch (const std::exception& e) {
    failWith(e.what());
    return;
  }
  while (!stop_) {
    // Wait for a header, failing pending receives whose deadline passes.
    bool ready = false;
    while (!stop_ && !ready) {
      pollfd pf{fd, POLLIN, 0};
      ready = poll(&pf, 1, 100) > 0;
      if (!ready) {
        warnLate(rank, p, /*connected=*/true);
        expireLate(rank, p);
      }
    }
    if (stop_) return;
    {
      // Failed by the send side: nothing can take this peer's messages now.
      std::lock_guard<std::mutex> lock(p.mu);
      if (p.failed) return;
    }
    // Also while the peer keeps sending other tags: a due receive fails at
    // its deadline, not when the line goes quiet.
    warnLate(rank, p, /*connected=*/true);
    expireLate(rank, p);
    // A receive taken off the queue is this thread's to complete, also when
    // its payload never arrives (failAll only sees the queues).
    RecvReq target{};
    bool matched = false;
    try {
      uint8_t wire[sizeof(P2PHeader)];
      recvAll(fd, wire, sizeof wire, payloadWait(what));
      P2PHeaderParse parsed = parseP2PHeader(wire, sizeof wire);
      if (!parsed.ok)
        throw CommError(CommError::Kind::Protocol,
                        strCat("corrupt message header (", parsed.why, ")"));
      const P2PHeader& h = parsed.header;
      {
        std::lock_guard<std::mutex> match(matchMu_);
        matched = takeMatch(p, h.tag, &target);
      }
      if (matched && P2PHeader::carriesReport(h.flags)) {
        std::vector<char> report;
        recvPayload(fd, report, h.bytes, payloadWait(what));
        matched = false;
        failFromSender(rank, target, h.flags, report);
        dropOrLeak(target);
        continue;
      }
      if (matched && target.bytes == h.bytes) {
        // The message is arriving: a receive due meanwhile still gets it
        // (a partial read would leave the stream unusable).
        recvAll(fd, target.buf, h.bytes, payloadWait(what));
        matched = false;
        finish(target, rank, nullptr);
        dropOrLeak(target);  // it may hold the last reference to Python's tensors
        continue;
      }
      if (matched) {
        // Drained through a small buffer: only the size goes into the error.
        discardPayload(fd, h.bytes, payloadWait(what));
        matched = false;
        finish(target, rank, std::make_exception_ptr(sizeMismatch(rank, target, h.bytes)));
        dropOrLeak(target);
        continue;
      }
      Arrived msg{{}, h.flags, 0};
      recvPayload(fd, msg.payload, h.bytes, payloadWait(what));
      // A receive may have been posted while the payload was arriving.
      RecvReq late{};
      bool lateMatch;
      {
        std::lock_guard<std::mutex> match(matchMu_);
        lateMatch = takeMatch(p, h.tag, &late);
        if (!lateMatch) {
          msg.arrived = nextArrival_++;
          p.early[h.tag].push_back(std::move(msg));
        }
      }
      if (lateMatch) {
        completeFromBuffer(rank, late, msg);
        dropOrLeak(late);
      }
    } catch (const std::exception& e) {
      failWith(e.what());
      if (matched) {
        std::exception_ptr why;
        {
          std::lock_guard<std::mutex> lock(p.mu);
          why = p.failed;
        }
        finish(target, rank, why);
        dropOrLeak(target);
      }
      return;
    }
  }
}

}  // namespace smdccl
