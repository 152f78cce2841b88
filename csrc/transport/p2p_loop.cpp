// P2PEngine's part of the process's event loops (p2p_loops.h): one thread
// polls every peer's sending sockets, another every receiving one, and each
// moves what its path (a socket, or a shared-memory ring) can take without
// blocking. A peer's channels (P2POutChannel, P2PInChannel: the message in
// flight and its path) are their loop's alone; the queues they take from
// and the matching are under mu_, the I/O is not.
#include <poll.h>

#include "common/log.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

void P2PEngine::failAll(const std::string& what, Later& later) {
  SMDCCL_WARN("send/recv on group '", group_, "' failed: ", what);
  std::lock_guard<std::mutex> lock(mu_);
  auto why = std::make_exception_ptr(CommError(
      CommError::Kind::System, strCat("smdccl: send/recv on group '", group_, "' failed: ", what)));
  for (int r = 0; r < mesh_.size(); ++r)
    if (r != mesh_.rank()) failPeer(r, why, later);
  failOwnRecvs(why, later);
}

int P2PEngine::prepareTurn(Direction d, P2PPollSet& set, Later& later,
                           std::vector<std::string>& warnings) {
  if (d == Direction::Out) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      startSends(later, warnings);
    }
    // The data's readiness (a GPU copy's event) is asked outside the lock:
    // Peer::out is this loop's own.
    for (int r = 0; r < mesh_.size(); ++r)
      if (r != mesh_.rank() && peers_[r]->out.active && !peers_[r]->out.ready)
        peers_[r]->out.pollReady();
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (d == Direction::Out) pollSends(set);
  else prepareIn(later, warnings, set);
  return pollTimeoutMs(d);
}

void P2PEngine::serve(Direction d, int rank, Later& later) {
  Peer& p = *peers_[rank];
  if (d == Direction::Out) {
    serveOut(rank, p, later);
  } else if (!readSome(rank, p, later)) {
    std::lock_guard<std::mutex> lock(mu_);
    endIn(rank, p, later);
  }
}

void P2PEngine::startSends(Later& later, std::vector<std::string>& warnings) {
  expireSends(later);
  warnSends(warnings);
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = *peers_[r];
    if (p.failed) endOut(p, later);
    else if (!p.out.active) startSend(p);
  }
}

void P2PEngine::pollSends(P2PPollSet& set) {
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = *peers_[r];
    if (p.failed || !p.out.active || !p.out.ready) continue;
    if (p.outFd >= 0) {
      if (!p.out.connected) {
        p.out.connected = true;
        p.out.lastMoved = P2POutChannel::Clock::now();  // "has sent nothing for" counts from here
      }
      // A full ring waits for its reader's wake-up; otherwise the socket
      // (whose buffer holds at most wake-ups then) is ready at once.
      set.add(p.outFd, p.out.waitRoom ? POLLIN : POLLOUT, this, r);
    } else if (!p.dialing) {
      p.dialing = true;
      p.dialBy = p.out.req.deadline;
      p.dialTag = p.out.req.tag;
      dials_.push_back(r);
      wakeConnector();
    }
  }
}

void P2PEngine::prepareIn(Later& later, std::vector<std::string>& warnings, P2PPollSet& set) {
  int arrivals = mesh_.p2pArrivalFd();
  if (arrivals >= 0) set.add(arrivals, POLLIN);
  acceptArrivals(later);
  expireRecvs(later);
  warnRecvs(warnings);
  for (int r = 0; r < mesh_.size(); ++r) {
    if (r == mesh_.rank()) continue;
    Peer& p = *peers_[r];
    if (p.failed) {
      endIn(r, p, later);
    } else if (p.reading && p.inFd >= 0) {
      // POLLOUT: a socket that only ever carries a few wake-up bytes back
      // is writable at once, so the peer's turn comes without waiting.
      set.add(p.inFd, p.in.readNow ? POLLIN | POLLOUT : POLLIN, this, r);
    }
  }
}

void P2PEngine::acceptArrivals(Later& later) {
  for (int r = 0; r < mesh_.size(); ++r) {
    Peer& p = *peers_[r];
    if (r == mesh_.rank() || !p.reading || p.inFd >= 0 || p.failed) continue;
    // Connections wait in the listener until a receive from their sender
    // is posted: until then its data stays with the sender (a send nobody
    // receives shows as stuck there, not as memory here).
    try {
      p.inFd = mesh_.acceptP2P(r);
    } catch (const std::exception& e) {
      // The group failed here (its links are closed): a receive waiting
      // for this peer's connection never gets it.
      if (!p.recvs.empty() || !anyRecvs_.empty()) failPeer(r, recvFailure(r, e.what()), later);
    }
  }
}

bool P2PEngine::startSend(Peer& p) {
  if (p.sends.empty()) return false;
  p.out.start(std::move(p.sends.front()));
  p.sends.pop_front();
  return true;
}

void P2PEngine::serveOut(int rank, Peer& p, Later& later) {
  P2POutChannel& o = p.out;
  if (!o.active) return;
  try {
    if (o.move(mesh_, rank, p.outFd) > 0) o.lastMoved = P2POutChannel::Clock::now();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(mu_);
    failSending(rank, o.req.tag, e.what(), later);
    endOut(p, later);
    return;
  }
  if (!o.finished()) return;
  later.push_back([req = std::move(o.req), e = o.notReady] { req.done(e); });
  o.clear();
  std::lock_guard<std::mutex> lock(mu_);
  if (!p.failed) startSend(p);  // the next one; its readiness is asked next turn
}

bool P2PEngine::readSome(int rank, Peer& p, Later& later) {
  if (p.in.reader.buffering() && !p.in.matched) matchMidMessage(p);
  try {
    p.in.read(mesh_, rank, p.inFd, P2POutChannel::kTurnBytes,
              {.timeout = &timeout_,
               .header = [&] { headerRead(rank, p, later); },
               .message = [&] { messageRead(rank, p, later); }});
    return true;
  } catch (const std::exception& e) {  // the connection, or memory for a message
    std::lock_guard<std::mutex> lock(mu_);
    failPeer(rank, recvFailure(rank, e.what()), later);
    return false;
  }
}

void P2PEngine::headerRead(int rank, Peer& p, Later& later) {
  P2PInChannel& in = p.in;
  const P2PHeader& h = in.reader.header();
  std::lock_guard<std::mutex> lock(mu_);
  // A failed peer's receives have failed; its turn ends with this one.
  in.matched = !p.failed && takeMatch(p, h.tag, &in.target);
  if (!in.matched || P2PHeader::carriesReport(h.flags))
    in.reader.sinkTo(P2PReader::Sink::Buffer);  // a message nobody asked for yet, or a report
  else if (in.target.bytes == h.bytes) in.reader.sinkTo(P2PReader::Sink::Into, in.target.buf);
  else in.reader.sinkTo(P2PReader::Sink::Drain);  // only its size goes into the error
}

void P2PEngine::matchMidMessage(Peer& p) {
  P2PInChannel& in = p.in;
  const P2PHeader& h = in.reader.header();
  if (P2PHeader::carriesReport(h.flags)) return;
  std::lock_guard<std::mutex> lock(mu_);
  // The receive that its end would take (see messageRead): what has come
  // is copied over once, the rest lands in place, not in a buffer first.
  if (p.failed || !takeMatch(p, h.tag, &in.target)) return;
  in.matched = true;
  if (in.target.bytes == h.bytes) in.reader.redirect(P2PReader::Sink::Into, in.target.buf);
  else in.reader.redirect(P2PReader::Sink::Drain);
}

void P2PEngine::messageRead(int rank, Peer& p, Later& later) {
  P2PInChannel& in = p.in;
  const P2PHeader h = in.reader.header();
  const bool report = P2PHeader::carriesReport(h.flags);
  std::lock_guard<std::mutex> lock(mu_);
  if (in.matched && report) {
    later.push_back(
        [group = group_, rank, flags = h.flags, r = std::move(in.target),
         text = in.reader.takeBuffer()]() mutable { failFromSender(group, rank, r, flags, text); });
  } else if (in.matched && in.target.bytes == h.bytes) {
    finishLater(later, std::move(in.target), rank, nullptr);
  } else if (in.matched) {
    auto e = std::make_exception_ptr(sizeMismatch(group_, rank, in.target, h.bytes));
    finishLater(later, std::move(in.target), rank, e);
  } else {
    Arrived msg{in.reader.takeBuffer(), h.flags, 0};
    // A receive may have been posted while the payload was arriving.
    RecvReq late;
    if (takeMatch(p, h.tag, &late)) {
      later.push_back([group = group_, rank, r = std::move(late), m = std::move(msg)]() mutable {
        completeFromBuffer(group, rank, r, m);
      });
    } else {
      msg.arrived = nextArrival_++;
      p.early[h.tag].push_back(std::move(msg));
    }
  }
  in.matched = false;
  in.reader.next();
}

void P2PEngine::endOut(Peer& p, Later& later) {
  if (p.out.active) later.push_back([req = std::move(p.out.req), e = p.failed] { req.done(e); });
  p.out.clear();
}

void P2PEngine::endIn(int rank, Peer& p, Later& later) {
  if (p.in.matched) finishLater(later, std::move(p.in.target), rank, p.failed);
  p.in.matched = false;
  p.in.reader.next();
}

}  // namespace smdccl
