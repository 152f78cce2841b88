#pragma once
// User-level send/recv with tags (wire format: p2p_frame.h; transfers that
// take long: p2p_watch.cpp). Each (peer, direction) gets its own socket
// and thread, so a send never waits behind a collective or behind a receive
// (two ranks may both send first). A message is a header {tag, bytes} and the
// payload; receives match the oldest pending receive of the same tag (from
// that peer, or from any source), and messages that arrive before their
// receive is posted are buffered.
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "common/error.h"
#include "transport/p2p_frame.h"
#include "transport/socket_util.h"

namespace smdccl {

class Mesh;

using Completion = std::function<void(std::exception_ptr)>;

class P2PEngine {
 public:
  // `timeout` gives the group's current timeout: the bound on reading a
  // message nobody has asked for yet.
  // `warnAfterS` (SMDCCL_WARN_AFTER; <= 0: never): a receive still waiting
  // after that long logs a warning saying what has (not) arrived from the
  // peer -- e.g. messages of another tag, or no connection at all.
  P2PEngine(Mesh& mesh, std::string groupName, std::function<std::chrono::milliseconds()> timeout,
            double warnAfterS = 0);
  ~P2PEngine();

  // A message to send: `bytes` at `buf`, matched by `tag`, due by
  // `deadline`; `done` runs once with its outcome. `ready`, when given,
  // runs on the send thread before anything is sent (e.g. waits for a GPU
  // copy into `buf`); what it throws fails this send and the receive it
  // matches (the receiver gets why), nothing else. `flags` go into the
  // header (P2PHeader::kNonFinite: buf is a report).
  struct Outgoing {
    const void* buf = nullptr;
    size_t bytes = 0;
    int64_t tag = 0;
    Deadline deadline;
    Completion done;
    std::function<void(Deadline)> ready = nullptr;
    uint32_t flags = 0;
  };
  void send(int peer, Outgoing m);
  // Where a message lands: `bytes` at `buf`, for a message of `tag`, by
  // `deadline`; `done` runs once with the outcome.
  struct Incoming {
    void* buf = nullptr;
    size_t bytes = 0;
    int64_t tag = 0;
    Deadline deadline;
    Completion done;
  };
  void recv(int peer, Incoming m);
  // A receive from whichever peer's message of `tag` comes first (gloo's
  // recvAnysource). It matches in post order with the peer-specific
  // receives of the tag: a message goes to the earliest posted receive that
  // can take it. `source` learns the sender before `done` runs. It fails
  // at its deadline, or once every peer has failed (or abort()).
  void recvAny(Incoming m, std::function<void(int)> source);
  // ProcessGroup.abort(): every pending and later send and receive fails
  // with `why`. Transfers in flight stop at their next wait (they watch the
  // mesh's cancel flag, which the caller sets).
  void abort(std::exception_ptr why);

 private:
  struct SendReq {
    uint64_t id;  // which request the sender thread holds, once failAll may have taken it
    const void* buf;
    size_t bytes;
    int64_t tag;
    Deadline deadline;
    Completion done;
    std::function<void(Deadline)> ready;
    uint32_t flags;
  };
  struct RecvReq {
    void* buf = nullptr;
    size_t bytes = 0;
    int64_t tag = 0;
    Deadline deadline = Deadline::never();
    Completion done;
    uint64_t posted = 0;              // post order over all receives
    std::function<void(int)> source;  // recvAny: told the sender's rank
    std::chrono::steady_clock::time_point postedAt = std::chrono::steady_clock::now();
    bool warned = false;  // SMDCCL_WARN_AFTER: said once
  };
  // A message read before a receive for it was posted.
  struct Arrived {
    std::vector<char> payload;
    uint32_t flags;
    uint64_t arrived;  // arrival order over all peers (recvAny takes the oldest)
  };
  using EarlyMap = std::map<int64_t, std::deque<Arrived>>;
  struct Peer {
    std::mutex mu;  // sends, failed, the threads; taken after matchMu_
    std::condition_variable cv;
    std::deque<SendReq> sends;
    std::deque<RecvReq> recvs;  // under matchMu_
    EarlyMap early;             // under matchMu_: arrived before a recv, by tag
    std::thread sender, receiver;
    std::exception_ptr failed;  // sticky: the peer is gone
  };

  Peer& peer(int rank);
  void senderLoop(int rank, Peer& p);
  void receiverLoop(int rank, Peer& p);
  // Waits for `rank`'s send connection while receives that it could complete
  // are pending; a deadline passing fails those receives only. -1: stopped
  // or failed (then everything pending is failed).
  int acceptSender(int rank, Peer& p);
  // Starts `rank`'s receiver thread if it is not running (p.mu held).
  void ensureReceiver(int rank, Peer& p);
  void failAll(Peer& p, std::exception_ptr e);
  // Fails the receives `rank`'s thread serves (its own and the any-source
  // ones) whose deadline has passed.
  void expireLate(int rank, Peer& p);
  // SMDCCL_WARN_AFTER: logs, once each, the receives `rank`'s thread serves
  // that have waited that long. `connected`: whether the peer has connected
  // for send/recv at all.
  void warnLate(int rank, Peer& p, bool connected);
  // Sends `out` (part of `req`'s message) to `rank` on `fd` by its deadline;
  // once no byte of it has gone out for SMDCCL_WARN_AFTER (e.g. the peer
  // posts no receive from this rank, so nothing reads the socket once its
  // buffers are full), logs once what is stuck. `progress` carries the
  // message's bytes out, when one last moved and "said once" across the
  // header and the payload.
  struct SendProgress {
    uint64_t sent = 0;
    uint64_t total = 0;  // header and payload
    std::chrono::steady_clock::time_point lastMoved = std::chrono::steady_clock::now();
    bool warned = false;
  };
  struct Span {
    const void* data;
    size_t bytes;
  };
  void sendWatched(int rank, int fd, const SendReq& req, Span out, SendProgress* progress) const;
  // When the next of those warnings is due (never when off or none pending; matchMu_ held).
  Deadline nextWarning(Peer& p) const;
  // The receive a message of `tag` from `p` completes: the earliest posted
  // of p's receives of the tag and the any-source ones, removed from its
  // queue (matchMu_ held).
  bool takeMatch(Peer& p, int64_t tag, RecvReq* out);
  // The earliest deadline of the receives `p`'s thread serves; false: none.
  bool earliestDeadline(Peer& p, Deadline* out);
  // The oldest buffered message of `it`'s tag, removed (matchMu_ held).
  static Arrived takeEarly(Peer& p, EarlyMap::iterator it);
  // Completes every request of `q` with `e` and empties it (no lock held).
  static void failRecvs(std::deque<RecvReq>& q, std::exception_ptr e);
  void completeFromBuffer(int rank, RecvReq& req, const Arrived& msg);
  static void finish(RecvReq& req, int rank, std::exception_ptr err);
  // A receive matched by a kNonFinite or kSenderFailed message (`flags`):
  // fails with the sender's report.
  void failFromSender(int rank, RecvReq& req, uint32_t flags,
                      const std::vector<char>& report) const;
  InvalidArgument sizeMismatch(int rank, const RecvReq& req, uint64_t sent) const;
  // A read off `what`'s connection: bounded by the group's timeout from now.
  SocketWait payloadWait(const std::string& what) const;

  Mesh& mesh_;
  std::string group_;
  std::function<std::chrono::milliseconds()> timeout_;
  std::mutex mu_;
  std::map<int, std::unique_ptr<Peer>> peers_;
  std::exception_ptr aborted_;  // under mu_: peers made after abort() start failed
  // Receive matching: every peer's recvs and early messages, and the
  // any-source receives; taken before any Peer::mu.
  std::mutex matchMu_;
  std::condition_variable matchCv_;  // a receive was posted (receivers waiting to connect)
  std::deque<RecvReq> anyRecvs_;
  std::exception_ptr anyFailed_;  // every peer failed (or abort()): any-source receives fail
  int failedPeers_ = 0;           // under matchMu_
  std::atomic<uint64_t> nextPost_{1}, nextArrival_{1};
  double warnAfterS_;
  std::atomic<uint64_t> nextSendId_{1};
  std::atomic<bool> stop_{false};
};

}  // namespace smdccl
