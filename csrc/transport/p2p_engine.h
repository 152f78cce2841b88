#pragma once
// User-level send/recv with tags (wire format: p2p_frame.h). The process's
// two event loops move every group's messages over non-blocking sockets, one
// sending and one receiving, and its connector makes the connections and asks
// whether a silent peer is gone (p2p_loops.h): an engine has no threads of
// its own, so they grow neither with the peers nor with the groups. Each (peer, direction) has
// its own socket, dialled by the sender, so a send never waits behind a collective or behind a
// receive (two ranks may both send first). Between ranks of one node the bytes go through a
// shared-memory ring instead, the socket carrying wake-ups (p2p_shm_stream.h; which of the two
// is the socket's first byte: p2p_out_channel.h). A message is a header {tag, bytes} and the
// payload; receives match the oldest pending receive of the same tag (from that peer, or from any
// source), and messages that arrive before their receive is posted are buffered. The engine's part
// of a loop's turn: p2p_loop.cpp; of the connector's: p2p_connector.cpp; deadlines and
// SMDCCL_WARN_AFTER's warnings: p2p_watch.cpp.
#include <atomic>
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
#include "transport/p2p_loops.h"
#include "transport/p2p_in_channel.h"
#include "transport/p2p_out_channel.h"
#include "transport/p2p_requests.h"

namespace smdccl {

class Mesh;

class P2PEngine final : private P2PHandler {
 public:
  // `timeout` gives the group's current timeout: the bound on reading a
  // message nobody has asked for yet.
  // `warnAfterS` (SMDCCL_WARN_AFTER; <= 0: never): a receive still waiting
  // after that long logs a warning saying what has (not) arrived from the
  // peer -- e.g. messages of another tag, or no connection at all.
  P2PEngine(Mesh& mesh, std::string groupName, std::function<std::chrono::milliseconds()> timeout,
            double warnAfterS = 0);
  ~P2PEngine();

  // A message to send (p2p_requests.h). To this rank itself (torch's isend
  // allows it): copied into its receive from itself, or kept until one is
  // posted; done once copied (a CUDA tensor's copy to host waited for first).
  using Outgoing = P2PSend;
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
  // with `why`, those in flight included.
  void abort(std::exception_ptr why);

 private:
  using Clock = std::chrono::steady_clock;
  using RecvReq = P2PRecv;
  // A message read before a receive for it was posted.
  struct Arrived {
    std::vector<char> payload;
    uint32_t flags;
    uint64_t arrived;  // arrival order over all peers (recvAny takes the oldest)
  };
  using EarlyMap = std::map<int64_t, std::deque<Arrived>>;
  struct Peer {
    // Under mu_:
    std::deque<Outgoing> sends;  // not started yet
    std::deque<RecvReq> recvs;
    EarlyMap early;             // arrived before a recv, by tag
    std::exception_ptr failed;  // sticky: the peer is gone
    bool reading = false;       // a receive from it was posted: accept and read
    bool dialing = false;       // the connector is connecting `outFd`...
    Deadline dialBy;            // ...by the deadline of the send that needs it
    int64_t dialTag = 0;
    int outFd = -1, inFd = -1;
    P2POutChannel out;  // the sending loop's only
    P2PInChannel in;    // the receiving loop's only
  };
  // What completes after mu_ is released (completions may call back in).
  // Completions never call into the engine (they name the group by a copy
  // of its name): a loop runs them after its turn, when the engine may be gone.
  using Later = P2PLater;

  // p2p_engine.cpp: posting, matching, failing.
  // mu_ held: the process's loops serve this engine from now on (throws
  // when they cannot start).
  void attachLoops();
  // The loops serving this engine, if they are this process's (nullptr
  // before its first send or receive, and in a forked child).
  P2PLoops* liveLoops() const;
  using Direction = P2PDirection;
  void wake(Direction d);
  void wakeBoth();
  void wakeConnector();
  // The oldest receive of `tag` from p, or (anySource) from any rank; mu_ held.
  bool takeMatch(Peer& p, int64_t tag, RecvReq* out, bool anySource = true);
  void sendToSelf(Outgoing m);
  // Fails this rank's receives from itself (abort, a failed group; mu_ held).
  void failOwnRecvs(std::exception_ptr e, Later& later);
  static Arrived takeEarly(Peer& p, EarlyMap::iterator it);
  static void completeFromBuffer(const std::string& group, int rank, RecvReq& req,
                                 const Arrived& msg);
  static void finish(RecvReq& req, int rank, std::exception_ptr err);
  static void finishLater(Later& later, RecvReq req, int rank, std::exception_ptr err);
  static void failFromSender(const std::string& group, int rank, RecvReq& req, uint32_t flags,
                             const std::vector<char>& report);
  static InvalidArgument sizeMismatch(const std::string& group, int rank, const RecvReq& req,
                                      uint64_t sent);
  // Fails everything queued for `rank` (and, once every peer has failed,
  // the any-source receives) with `e`, or the peer's first failure (mu_
  // held; the completions go to `later`).
  void failPeer(int rank, std::exception_ptr e, Later& later);
  // A send to `rank` (of `tag`) failed for `why`: logs it and fails the
  // peer (mu_ held).
  void failSending(int rank, int64_t tag, const std::string& why, Later& later);
  std::exception_ptr recvFailure(int rank, const std::string& why) const;

  // p2p_loop.cpp: this engine's part of a loop's turn (P2PHandler; the
  // loops run one per direction: sends are written while messages are
  // read, as two peers' sockets need).
  int prepareTurn(Direction d, P2PPollSet& set, Later& later,
                  std::vector<std::string>& warnings) override;
  void serve(Direction d, int rank, Later& later) override;
  void failAll(const std::string& what, Later& later) override;
  // The sending loop's bookkeeping (mu_ held): deadlines, warnings, the
  // next send of each peer; then which sockets to poll, and dials to ask for.
  void startSends(Later& later, std::vector<std::string>& warnings);
  void pollSends(P2PPollSet& set);
  // The receiving loop's (mu_ held): connections, deadlines, warnings, what to poll.
  void prepareIn(Later& later, std::vector<std::string>& warnings, P2PPollSet& set);
  // One peer's turn after poll(): start, move and end its transfers.
  void serveOut(int rank, Peer& p, Later& later);

  bool startSend(Peer& p);  // mu_ held
  // Reads what is there of the current message; false: the peer failed.
  bool readSome(int rank, Peer& p, Later& later);
  // A message's header is in: match it, and say where its payload goes.
  void headerRead(int rank, Peer& p, Later& later);
  // A receive posted while a message nobody had asked for was arriving
  // takes it now, if it would take it at its end.
  void matchMidMessage(Peer& p);
  // A message is in: complete its receive, or keep it for one.
  void messageRead(int rank, Peer& p, Later& later);
  // End the loops' own transfers of a failed peer with its error (mu_ held).
  void endOut(Peer& p, Later& later);
  void endIn(int rank, Peer& p, Later& later);
  // Takes the connections of peers whose messages are wanted (mu_ held).
  void acceptArrivals(Later& later);

  // p2p_connector.cpp: this engine's part of the connector's turn. What may
  // block runs on short-lived threads of the engine's own (so one group's
  // slow peer holds up no other group): a dial per peer, and one probe of
  // the silent peers at a time. The turn joins those that ended, takes
  // their completions, and starts those that are due (mu_ held by `lock`).
  void connectorTurn(Later& later) override;
  void startDials();
  void startProbe();
  // Receives wait for `rank`, which has not connected (mu_ held).
  bool silent(int rank) const;
  void dial(int rank);
  // The probe thread: fails the peers that receives wait for, that have not
  // connected and are gone.
  void probeSilentPeers();
  // Completions of a dial or probe thread, for the connector's next turn
  // to run (on a thread that is not the engine's).
  void handOver(Later& later);

  // p2p_watch.cpp: deadlines and warnings (mu_ held).
  // Fails the receives whose deadline has passed, and a message that
  // stopped arriving.
  void expireRecvs(Later& later);
  // A send in flight past its deadline fails its peer; one whose data was
  // never ready tells the receiver so.
  void expireSends(Later& later);
  // SMDCCL_WARN_AFTER: the receives that have waited that long, and the
  // sends that have not moved for that long, once each.
  void warnRecvs(std::vector<std::string>& lines);
  void warnSends(std::vector<std::string>& lines);
  // How long a loop may sleep: until its next deadline or warning, at most
  // 100 ms.
  int pollTimeoutMs(Direction d) const;
  Deadline nextWarning(Direction d) const;

  Mesh& mesh_;
  std::string group_;
  std::function<std::chrono::milliseconds()> timeout_;
  double warnAfterS_;
  std::atomic<P2PLoops*> loops_{nullptr};  // set by attachLoops
  mutable std::mutex mu_;
  // Under mu_: the connector's work for this engine.
  std::deque<int> dials_;               // peers to connect to
  std::map<int, std::thread> dialers_;  // by peer: its dial in progress
  std::vector<int> dialed_;             // peers whose dial thread has ended
  std::thread prober_;                  // the probe of silent peers in progress
  bool probed_ = false;                 // ...has ended
  Clock::time_point lastProbe_;         // ...started
  Later handedOver_;                    // completions from those threads
  std::vector<std::unique_ptr<Peer>> peers_;
  std::deque<RecvReq> anyRecvs_;
  std::exception_ptr anyFailed_;  // every peer failed (or abort()): any-source receives fail
  std::exception_ptr aborted_;
  int failedPeers_ = 0;
  uint64_t nextPost_ = 1, nextArrival_ = 1;
  std::atomic<bool> stop_{false};
};

}  // namespace smdccl
