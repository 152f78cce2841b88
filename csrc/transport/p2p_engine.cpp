#include "transport/p2p_engine.h"

#include <cstdint>
#include <poll.h>

#include <algorithm>
#include <cstring>

#include "common/error.h"
#include "common/exit_fence.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "transport/byte_order.h"
#include "transport/mesh.h"
#include "transport/socket_util.h"

namespace smdccl {

P2PHeaderParse parseP2PHeader(const uint8_t* data, size_t len) {
  P2PHeaderParse r;
  if (data == nullptr || len < sizeof(P2PHeader)) {
    r.why = "incomplete header";
    return r;
  }
  P2PHeader& h = r.header;
  h.magic = static_cast<uint32_t>(loadLE(data, 4));
  h.flags = static_cast<uint32_t>(loadLE(data + 4, 4));
  h.tag = static_cast<int64_t>(loadLE(data + 8, 8));
  h.bytes = loadLE(data + 16, 8);
  if (h.magic != P2PHeader::kMagic) {
    r.why = "bad magic";
  } else if (h.bytes > P2PHeader::kMaxBytes) {
    r.why = "length over the limit";
  } else {
    r.ok = true;
  }
  return r;
}

void encodeP2PHeader(const P2PHeader& h, uint8_t out[sizeof(P2PHeader)]) {
  storeLE(out, h.magic, 4);
  storeLE(out + 4, h.flags, 4);
  storeLE(out + 8, static_cast<uint64_t>(h.tag), 8);
  storeLE(out + 16, h.bytes, 8);
}

void recvPayload(int fd, std::vector<char>& out, uint64_t bytes, const SocketWait& w) {
  out.clear();
  size_t got = 0;
  while (got < bytes) {
    // Grow by what has arrived so far (at least a chunk): the allocation
    // follows the data, not the length field.
    size_t step =
        static_cast<size_t>(std::min<uint64_t>(bytes - got, std::max(kPayloadChunk, got)));
    out.resize(got + step);
    recvAll(fd, out.data() + got, step, w);
    got += step;
  }
}

void discardPayload(int fd, uint64_t bytes, const SocketWait& w) {
  if (bytes == 0) return;
  std::vector<char> sink(static_cast<size_t>(std::min<uint64_t>(bytes, kPayloadChunk)));
  while (bytes > 0) {
    size_t step = static_cast<size_t>(std::min<uint64_t>(bytes, sink.size()));
    recvAll(fd, sink.data(), step, w);
    bytes -= step;
  }
}

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

void P2PEngine::send(int rank, const void* buf, size_t bytes, int64_t tag, Deadline deadline,
                     Completion done, std::function<void(Deadline)> ready, uint32_t flags) {
  Peer& p = peer(rank);
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.failed) {
    done(p.failed);
    return;
  }
  p.sends.push_back(
      {nextSendId_++, buf, bytes, tag, deadline, std::move(done), std::move(ready), flags});
  if (!p.sender.joinable()) p.sender = std::thread([this, rank, &p] { senderLoop(rank, p); });
  p.cv.notify_all();
}

void P2PEngine::recv(int rank, void* buf, size_t bytes, int64_t tag, Deadline deadline,
                     Completion done) {
  Peer& p = peer(rank);
  RecvReq req{buf, bytes, tag, deadline, std::move(done), nextPost_++, nullptr};
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

void P2PEngine::recvAny(void* buf, size_t bytes, int64_t tag, Deadline deadline,
                        std::function<void(int)> source, Completion done) {
  RecvReq req{buf, bytes, tag, deadline, std::move(done), nextPost_++, std::move(source)};
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

bool P2PEngine::earliestDeadline(Peer& p, Deadline* out) {
  bool found = false;
  auto consider = [&](const RecvReq& r) {
    if (!found || r.deadline.at() < out->at()) *out = r.deadline;
    found = true;
  };
  for (const RecvReq& r : p.recvs) consider(r);
  for (const RecvReq& r : anyRecvs_) consider(r);
  return found;
}

void P2PEngine::expireLate(int rank, Peer& p) {
  std::vector<RecvReq> late;
  {
    std::lock_guard<std::mutex> match(matchMu_);
    auto take = [&](std::deque<RecvReq>& q) {
      for (auto it = q.begin(); it != q.end();) {
        if (it->deadline.expired()) {
          late.push_back(std::move(*it));
          it = q.erase(it);
        } else {
          ++it;
        }
      }
    };
    take(p.recvs);
    take(anyRecvs_);  // whichever receiver thread looks first
  }
  for (RecvReq& r : late) {
    std::string from = r.source ? std::string("any source") : strCat("rank ", rank);
    std::string what = r.source ? std::string("no rank sent a message with this tag")
                                : strCat("rank ", rank, " sent no message with this tag");
    finish(
        r, -1,
        std::make_exception_ptr(CommError(
            CommError::Kind::Timeout,
            strCat("smdccl: recv from ", from, " (tag ", r.tag, ", ", r.bytes, " bytes) on group '",
                   group_, "' timed out: ", what, ". Did it call send with the same tag?"))));
    dropOrLeak(r);  // it may hold the last reference to Python's tensors
  }
}

Deadline P2PEngine::nextWarning(Peer& p) const {
  Deadline next = Deadline::never();
  if (warnAfterS_ <= 0) return next;
  auto after = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(warnAfterS_));
  auto consider = [&](const RecvReq& r) {
    if (r.warned) return;
    Deadline due = Deadline::until(r.postedAt + after);
    if (due.at() < next.at()) next = due;
  };
  for (const RecvReq& r : p.recvs) consider(r);
  for (const RecvReq& r : anyRecvs_) consider(r);
  return next;
}

void P2PEngine::warnLate(int rank, Peer& p, bool connected) {
  if (warnAfterS_ <= 0) return;
  std::vector<std::string> lines;
  {
    std::lock_guard<std::mutex> match(matchMu_);
    auto now = std::chrono::steady_clock::now();
    // What is buffered and unclaimed, per peer: tags nobody receives.
    auto buffered = [&](int r, Peer& q) {
      std::string tags;
      for (const auto& [tag, msgs] : q.early)
        if (!msgs.empty()) tags += strCat(tags.empty() ? "" : ", ", tag, " (", msgs.size(), ")");
      return tags.empty() ? std::string() : strCat("rank ", r, " sent tag(s) ", tags);
    };
    auto check = [&](RecvReq& r, bool any) {
      double waited = std::chrono::duration<double>(now - r.postedAt).count();
      if (r.warned || waited < warnAfterS_) return;
      r.warned = true;
      std::string from = any ? std::string("any source") : strCat("rank ", rank);
      std::string state;
      if (any) {
        std::string other;
        for (int q = 0; q < mesh_.size(); ++q) {
          if (q == mesh_.rank()) continue;
          std::string theirs = buffered(q, peer(q));
          if (!theirs.empty()) other += strCat(other.empty() ? "" : "; ", theirs);
        }
        state = other.empty() ? strCat("no rank has sent tag ", r.tag)
                              : strCat("no rank has sent tag ", r.tag, "; ", other,
                                       " that no receive took (a tag mismatch?)");
      } else if (!connected) {
        state =
            strCat("rank ", rank, " has not connected for send/recv yet (no send to this rank)");
      } else {
        std::string other = buffered(rank, p);
        state = other.empty()
                    ? strCat("rank ", rank, " has sent nothing with tag ", r.tag)
                    : strCat(other, " that no receive took, not tag ", r.tag, " (a tag mismatch?)");
      }
      lines.push_back(strCat("smdccl: recv from ", from, " (tag ", r.tag, ", ", r.bytes,
                             " bytes) on group '", group_, "' has waited ",
                             static_cast<int64_t>(waited), " s (SMDCCL_WARN_AFTER=", warnAfterS_,
                             "): ", state));
    };
    for (RecvReq& r : p.recvs) check(r, false);
    for (RecvReq& r : anyRecvs_) check(r, true);
  }
  for (const std::string& line : lines) SMDCCL_WARN(line);
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
      sendWatched(rank, fd, req, h, sizeof h, &progress);
      sendWatched(rank, fd, req, payload, head.bytes, &progress);
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

void P2PEngine::sendWatched(int rank, int fd, const SendReq& req, const void* buf, size_t n,
                            SendProgress* progress) const {
  using Clock = std::chrono::steady_clock;
  std::string what = strCat("rank ", rank);
  const char* at = static_cast<const char*>(buf);
  size_t left = n;
  auto window =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(warnAfterS_));
  while (true) {
    // Watched in quarter-window slices: a slice that moved bytes is
    // progress (a large message to a slow link is not stuck).
    Deadline until = req.deadline;
    if (warnAfterS_ > 0 && !progress->warned) {
      auto sliceEnd = Clock::now() + window / 4;
      if (sliceEnd < until.at()) until = Deadline::until(sliceEnd);
    }
    size_t sent = 0;
    try {
      sendAll(fd, at, left, {.deadline = until, .what = what, .cancel = mesh_.cancelFlag()}, &sent);
      progress->sent += sent;
      return;
    } catch (const CommError& e) {
      progress->sent += sent;
      if (e.kind() != CommError::Kind::Timeout || until.at() == req.deadline.at()) throw;
      at += sent;
      left -= sent;
    }
    auto now = Clock::now();
    if (sent > 0) progress->lastMoved = now;
    if (now - progress->lastMoved < window) continue;
    progress->warned = true;
    SMDCCL_WARN(
        "smdccl: send to rank ", rank, " (tag ", req.tag, ", ", req.bytes, " bytes) on group '",
        group_, "' has sent nothing for ",
        static_cast<int64_t>(std::chrono::duration<double>(now - progress->lastMoved).count()),
        " s (SMDCCL_WARN_AFTER=", warnAfterS_, "): ", progress->sent, " of ", progress->total,
        " bytes (with the header) are out and rank ", rank,
        " is not reading them (has it posted a recv from this rank?)");
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
