#pragma once
// The process's send/recv threads, shared by every group's P2PEngine: one
// event loop writes every engine's outgoing messages, another reads the
// incoming ones (a socket is written while another is read: two peers that
// both send first need that), and a connector dials and probes for all of
// them. So a process has three send/recv threads, whatever its number of
// groups and peers (plus short-lived threads that dial or probe a peer).
// Their names: smdccl-p2p-send, smdccl-p2p-recv, smdccl-p2p-conn (and
// smdccl-p2p-dial, smdccl-p2p-peek).
// The loops start at the first engine's first send or receive and live as
// long as the process (a forked child starts its own).
#include <poll.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace smdccl {

enum class P2PDirection { Out, In };

class P2PHandler;

// What a loop's turn polls: each socket with the handler and peer rank it
// belongs to (no handler: a wake-up or arrival descriptor, only drained).
struct P2PPollSet {
  std::vector<pollfd> fds;
  std::vector<std::pair<P2PHandler*, int>> owners;
  void add(int fd, short events, P2PHandler* h = nullptr, int rank = -1) {
    fds.push_back({fd, events, 0});
    owners.emplace_back(h, rank);
  }
};

// Completions, run once a turn no longer calls into any handler (they may
// call back in, or drop the last reference to a tensor).
using P2PLater = std::vector<std::function<void()>>;
// Runs them, and drops them (or leaks them while the process exits).
void runP2PLater(P2PLater& later);

// What the loops serve: one group's part of each turn (P2PEngine). Called
// by one loop thread per direction, and by the connector.
class P2PHandler {
 public:
  // Before poll(): the bookkeeping, the sockets to poll, and how long
  // poll() may wait (ms).
  virtual int prepareTurn(P2PDirection d, P2PPollSet& set, P2PLater& later,
                          std::vector<std::string>& warnings) = 0;
  // After poll(): the turn of one peer whose socket is ready.
  virtual void serve(P2PDirection d, int rank, P2PLater& later) = 0;
  // The loop could not go on (poll() or an allocation failed): every peer fails with `what`.
  virtual void failAll(const std::string& what, P2PLater& later) = 0;
  // The connector's turn: dials and probes of silent peers.
  virtual void connectorTurn(P2PLater& later) = 0;

 protected:
  ~P2PHandler() = default;
};

class P2PLoops {
 public:
  // This process's loops, made at the first call (threads start at the first attach).
  static P2PLoops& instance();
  // This process's loops if made, else nullptr. In a forked child the
  // parent's (whose threads the child does not have) are not current.
  static P2PLoops* current();

  // The loops serve `h` from now on (idempotent); starts them if needed.
  void attach(P2PHandler* h);
  // Once it returns, no thread of these loops calls into `h` again.
  void detach(P2PHandler* h);
  // The loop of direction `d` (or the connector) starts a new turn soon.
  void wake(P2PDirection d);
  void wakeConnector();

 private:
  P2PLoops();
  // Who runs a turn: the two loops and the connector.
  enum Runner { kOut, kIn, kConnector, kRunners };
  struct Turn {
    bool busy = false;  // inside a turn, calling into the handlers it took
    uint64_t started = 0;
  };
  void start();  // mu_ held
  // A turn starts (busy, with the handlers attached now) and ends.
  std::vector<P2PHandler*> beginTurn(Runner who);
  void endTurn(Runner who);
  void loop(P2PDirection d);
  // One turn: its handler calls (turnInside), then, whatever they threw,
  // the end of the turn and its completions.
  void loopTurn(P2PDirection d);
  void turnInside(P2PDirection d, const std::vector<P2PHandler*>& handlers, P2PLater& later,
                  std::vector<std::string>& warnings);
  void connector();

  std::mutex mu_;
  std::condition_variable turnEnded_;  // detach waits on it
  std::condition_variable connectorCv_;
  bool connectorPoked_ = false;
  std::vector<P2PHandler*> handlers_;
  Turn turns_[kRunners];
  std::thread::id ids_[kRunners];
  int wakeFd_[2] = {-1, -1};  // eventfds, by direction: a loop's poll() returns
  bool running_[kRunners] = {false, false, false};
};

}  // namespace smdccl
