// P2PEngine's watch over transfers that take long: receives fail at their
// own deadline, whatever else the peer sends, and SMDCCL_WARN_AFTER warns
// about a receive still waiting (saying what has and has not arrived) and
// about a send whose bytes nobody reads.
#include <chrono>
#include <string>
#include <vector>

#include "common/exit_fence.h"
#include "common/log.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

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

void P2PEngine::sendWatched(int rank, int fd, const SendReq& req, Span out,
                            SendProgress* progress) const {
  using Clock = std::chrono::steady_clock;
  std::string what = strCat("rank ", rank);
  const char* at = static_cast<const char*>(out.data);
  size_t left = out.bytes;
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

}  // namespace smdccl
