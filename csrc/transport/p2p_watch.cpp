// P2PEngine's watch over transfers that take long (run by the loops, mu_
// held): receives fail at their own deadline, whatever else the peer sends;
// a send or a payload that stops moving fails the peer; SMDCCL_WARN_AFTER
// warns about a receive still waiting (saying what has and has not arrived)
// and about a send whose bytes nobody reads.
#include <chrono>
#include <string>
#include <vector>

#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

namespace {
std::chrono::steady_clock::duration seconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}
}  // namespace

void P2PEngine::expireRecvs(Later& later) {
  auto take = [&](std::deque<RecvReq>& q, int rank) {
    for (auto it = q.begin(); it != q.end();) {
      if (!it->deadline.expired()) {
        ++it;
        continue;
      }
      bool any = rank < 0;
      std::string from = any ? std::string("any source") : strCat("rank ", rank);
      std::string what = any ? std::string("no rank sent a message with this tag")
                             : strCat("rank ", rank, " sent no message with this tag");
      auto e = std::make_exception_ptr(CommError(
          CommError::Kind::Timeout, strCat("smdccl: recv from ", from, " (tag ", it->tag, ", ",
                                           it->bytes, " bytes) on group '", group_, "' timed out: ",
                                           what, ". Did it call send with the same tag?")));
      finishLater(later, std::move(*it), -1, e);
      it = q.erase(it);
    }
  };
  take(anyRecvs_, -1);
  for (int r = 0; r < mesh_.size(); ++r) {
    Peer& p = *peers_[r];
    take(p.recvs, r);  // this rank's receives from itself too
    if (r != mesh_.rank() && !p.failed && p.in.reader.midMessage() && p.in.due.expired()) {
      failPeer(r, recvFailure(r, strCat("timed out receiving from rank ", r)), later);
      endIn(r, p, later);
    }
  }
}

void P2PEngine::expireSends(Later& later) {
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = *peers_[r];
    P2POutChannel& o = p.out;
    if (p.failed || !o.active || !o.req.deadline.expired()) continue;
    if (!o.ready) {
      // Its data never came (a GPU copy that did not finish): the receiver
      // is told so, in time of its own.
      o.req.ready = []() -> bool {
        throw CommError(CommError::Kind::Timeout, "its data was not ready by the send's deadline");
      };
      o.req.deadline = Deadline::after(timeout_());
      o.pollReady();
    } else if (p.outFd >= 0) {  // a dial has its own deadline
      failSending(r, o.req.tag, strCat("timed out sending to rank ", r), later);
      endOut(p, later);
    }
  }
}

Deadline P2PEngine::nextWarning(Direction d) const {
  Deadline next = Deadline::never();
  if (warnAfterS_ <= 0) return next;
  auto consider = [&](bool warned, Clock::time_point since) {
    Deadline due = Deadline::until(since + seconds(warnAfterS_));
    if (!warned && due.at() < next.at()) next = due;
  };
  if (d == Direction::Out) {
    for (const auto& p : peers_)
      if (p->out.active && p->out.connected) consider(p->out.warned, p->out.lastMoved);
    return next;
  }
  for (const auto& p : peers_)
    for (const RecvReq& r : p->recvs) consider(r.warned, r.postedAt);
  for (const RecvReq& r : anyRecvs_) consider(r.warned, r.postedAt);
  return next;
}

int P2PEngine::pollTimeoutMs(Direction d) const {
  auto now = Clock::now();
  auto until = now + std::chrono::milliseconds(100);
  auto consider = [&](const Deadline& dl) {
    if (dl.at() < until) until = dl.at();
  };
  if (d == Direction::In)
    for (const RecvReq& r : anyRecvs_) consider(r.deadline);
  for (const auto& p : peers_) {
    if (p->failed) continue;
    if (d == Direction::In) {
      for (const RecvReq& r : p->recvs) consider(r.deadline);
      if (p->in.reader.midMessage()) consider(p->in.due);
    } else if (p->out.active) {
      // A send whose data is not there yet is polled (a GPU copy's event);
      // one being dialled has the dial's deadline, not this loop's.
      if (!p->out.ready) return 1;
      if (p->out.connected) consider(p->out.req.deadline);
    }
  }
  consider(nextWarning(d));
  if (until <= now) return 0;
  return static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(until - now).count() + 1);
}

void P2PEngine::warnRecvs(std::vector<std::string>& lines) {
  if (warnAfterS_ <= 0) return;
  auto now = Clock::now();
  // What is buffered and unclaimed, per peer: tags nobody receives.
  auto buffered = [&](int r) {
    std::string tags;
    for (const auto& [tag, msgs] : peers_[r]->early)
      if (!msgs.empty()) tags += strCat(tags.empty() ? "" : ", ", tag, " (", msgs.size(), ")");
    return tags.empty() ? std::string() : strCat("rank ", r, " sent tag(s) ", tags);
  };
  auto check = [&](RecvReq& r, int rank) {
    double waited = std::chrono::duration<double>(now - r.postedAt).count();
    if (r.warned || waited < warnAfterS_) return;
    r.warned = true;
    bool any = rank < 0;
    std::string from = any ? std::string("any source") : strCat("rank ", rank);
    std::string state;
    if (any) {
      std::string other;
      for (int q = 0; q < mesh_.size(); ++q) {
        if (q == mesh_.rank()) continue;
        std::string theirs = buffered(q);
        if (!theirs.empty()) other += strCat(other.empty() ? "" : "; ", theirs);
      }
      state = other.empty() ? strCat("no rank has sent tag ", r.tag)
                            : strCat("no rank has sent tag ", r.tag, "; ", other,
                                     " that no receive took (a tag mismatch?)");
    } else if (peers_[rank]->inFd < 0) {
      state = strCat("rank ", rank, " has not connected for send/recv yet (no send to this rank)");
    } else {
      std::string other = buffered(rank);
      state = other.empty()
                  ? strCat("rank ", rank, " has sent nothing with tag ", r.tag)
                  : strCat(other, " that no receive took, not tag ", r.tag, " (a tag mismatch?)");
    }
    lines.push_back(strCat("smdccl: recv from ", from, " (tag ", r.tag, ", ", r.bytes,
                           " bytes) on group '", group_, "' has waited ",
                           static_cast<int64_t>(waited), " s (SMDCCL_WARN_AFTER=", warnAfterS_,
                           "): ", state));
  };
  for (int q = 0; q < mesh_.size(); ++q)
    if (q != mesh_.rank())
      for (RecvReq& r : peers_[q]->recvs) check(r, q);
  for (RecvReq& r : anyRecvs_) check(r, -1);
}

void P2PEngine::warnSends(std::vector<std::string>& lines) {
  if (warnAfterS_ <= 0) return;
  auto now = Clock::now();
  auto window = seconds(warnAfterS_);
  for (int q = 0; q < mesh_.size(); ++q) {
    if (q == mesh_.rank()) continue;
    P2POutChannel& o = peers_[q]->out;
    // Once nothing has moved for a window (e.g. the peer posts no receive
    // from this rank, so nothing reads the socket once its buffers are full).
    if (!o.active || !o.connected || o.warned || now - o.lastMoved < window) continue;
    o.warned = true;
    lines.push_back(
        strCat("smdccl: send to rank ", q, " (tag ", o.req.tag, ", ", o.req.bytes,
               " bytes) on group '", group_, "' has sent nothing for ",
               static_cast<int64_t>(std::chrono::duration<double>(now - o.lastMoved).count()),
               " s (SMDCCL_WARN_AFTER=", warnAfterS_, "): ", o.sent, " of ",
               sizeof o.head + o.payloadBytes, " bytes (with the header) are out and rank ", q,
               " is not reading them (has it posted a recv from this rank?)"));
  }
}

}  // namespace smdccl
