// P2PLoops: the process's send/recv threads, and the turns that let an
// engine go away while they run (detach waits only for a turn that may
// still call into it; completions run after the turn, so a completion that
// destroys a group never waits for its own thread).
#include "transport/p2p_loops.h"

#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/error.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "common/exit_fence.h"

namespace smdccl {

void runP2PLater(P2PLater& later) {
  for (auto& f : later) f();
  dropOrLeak(later);  // the requests may hold the last reference to Python's tensors
}

namespace {
// Never freed: the loops run until the process ends.
std::atomic<P2PLoops*> processLoops{nullptr};

void drain(int fd) {
  uint64_t n;
  while (read(fd, &n, sizeof n) > 0) {}
}
}  // namespace

P2PLoops* P2PLoops::current() { return processLoops.load(); }

P2PLoops& P2PLoops::instance() {
  // A forked child has none of its parent's threads: it starts its own.
  static const int atfork = pthread_atfork(nullptr, nullptr, [] { processLoops.store(nullptr); });
  (void)atfork;
  P2PLoops* loops = processLoops.load();
  if (loops) return *loops;
  auto* made = new P2PLoops();
  if (processLoops.compare_exchange_strong(loops, made)) return *made;
  delete made;  // another thread made it first (no thread started yet)
  return *loops;
}

P2PLoops::P2PLoops() {
  for (int& fd : wakeFd_) {
    fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (fd < 0) throwSystemError("eventfd", errno);
  }
}

void P2PLoops::attach(P2PHandler* e) {
  std::lock_guard<std::mutex> lock(mu_);
  start();
  if (std::find(handlers_.begin(), handlers_.end(), e) == handlers_.end()) handlers_.push_back(e);
}

void P2PLoops::start() {
  // Detached: they outlive every engine, and the process may exit while
  // they wait in poll(). One that cannot be made (a thread limit) throws to
  // the caller's send or receive; a later one starts the rest.
  for (int w = 0; w < kRunners; ++w) {
    if (running_[w]) continue;
    if (w == kConnector) std::thread([this] { connector(); }).detach();
    else
      std::thread([this, w] { loop(w == kOut ? P2PDirection::Out : P2PDirection::In); }).detach();
    running_[w] = true;
  }
}

void P2PLoops::detach(P2PHandler* e) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = std::find(handlers_.begin(), handlers_.end(), e);
  if (it == handlers_.end()) return;
  handlers_.erase(it);
  uint64_t seen[kRunners];
  for (int w = 0; w < kRunners; ++w) seen[w] = turns_[w].started;
  connectorPoked_ = true;
  connectorCv_.notify_all();
  lock.unlock();
  wake(P2PDirection::Out);  // out of poll(): their turns end soon
  wake(P2PDirection::In);
  lock.lock();
  for (int w = 0; w < kRunners; ++w) {
    if (ids_[w] == std::this_thread::get_id()) continue;  // not inside a turn (see above)
    // A turn begun after the erase does not have `e`.
    turnEnded_.wait(lock, [&] { return !turns_[w].busy || turns_[w].started != seen[w]; });
  }
}

void P2PLoops::wake(P2PDirection d) {
  uint64_t one = 1;
  ssize_t n = write(wakeFd_[static_cast<int>(d)], &one, sizeof one);
  (void)n;  // EAGAIN: the counter is full, so the loop wakes anyway
}

void P2PLoops::wakeConnector() {
  std::lock_guard<std::mutex> lock(mu_);
  connectorPoked_ = true;
  connectorCv_.notify_all();
}

std::vector<P2PHandler*> P2PLoops::beginTurn(Runner who) {
  std::lock_guard<std::mutex> lock(mu_);
  ids_[who] = std::this_thread::get_id();
  turns_[who].busy = true;
  ++turns_[who].started;
  return handlers_;
}

void P2PLoops::endTurn(Runner who) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    turns_[who].busy = false;
  }
  turnEnded_.notify_all();
}

void P2PLoops::loop(P2PDirection d) {
  markOwnThread(d == P2PDirection::Out ? "smdccl-p2p-send" : "smdccl-p2p-recv");
  while (true) {
    try {
      loopTurn(d);
    } catch (const std::exception& e) {  // a warning or a completion threw: go on
      endTurn(d == P2PDirection::Out ? kOut : kIn);
      SMDCCL_WARN("send/recv loop: ", e.what());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

void P2PLoops::loopTurn(P2PDirection d) {
  const Runner who = d == P2PDirection::Out ? kOut : kIn;
  P2PLater later;
  std::vector<std::string> warnings;
  try {
    turnInside(d, beginTurn(who), later, warnings);
  } catch (const std::exception& e) {  // an allocation failed: the next turn tries again
    SMDCCL_WARN("send/recv loop: ", e.what());
  }
  endTurn(who);
  for (const std::string& line : warnings) SMDCCL_WARN(line);
  runP2PLater(later);  // also what came due before a failure
}

void P2PLoops::turnInside(P2PDirection d, const std::vector<P2PHandler*>& handlers, P2PLater& later,
                          std::vector<std::string>& warnings) {
  P2PPollSet set;
  set.add(wakeFd_[static_cast<int>(d)], POLLIN);
  int timeoutMs = 100;
  auto guarded = [&](P2PHandler* h, auto&& step) {
    try {
      step();
    } catch (const std::exception& ex) {
      h->failAll(ex.what(), later);  // what this loop serves of `h` cannot go on
    }
  };
  for (P2PHandler* h : handlers)
    guarded(h, [&] { timeoutMs = std::min(timeoutMs, h->prepareTurn(d, set, later, warnings)); });
  if (!later.empty()) timeoutMs = 0;  // completions are due: a glance only
  int n = poll(set.fds.data(), set.fds.size(), timeoutMs);
  if (n < 0 && errno != EINTR) {
    std::string why = strCat("poll: ", std::strerror(errno));
    for (P2PHandler* h : handlers) h->failAll(why, later);
  }
  for (size_t i = 0; n > 0 && i < set.fds.size(); ++i) {
    if (!set.fds[i].revents) continue;
    auto [h, rank] = set.owners[i];
    if (!h) drain(set.fds[i].fd);  // a wake-up, or a listener's arrivals
    else guarded(h, [&, h = h, rank = rank] { h->serve(d, rank, later); });
  }
}

void P2PLoops::connector() {
  markOwnThread("smdccl-p2p-conn");
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      connectorPoked_ = false;  // a poke from now on asks for the next turn
    }
    P2PLater later;
    try {
      for (P2PHandler* h : beginTurn(kConnector)) {
        try {
          h->connectorTurn(later);
        } catch (const std::exception& ex) {
          SMDCCL_WARN("send/recv connector: ", ex.what());  // its next turn tries again
        }
      }
    } catch (const std::exception& ex) {  // an allocation for the turn failed: try again
      SMDCCL_WARN("send/recv connector: ", ex.what());
    }
    endTurn(kConnector);
    try {
      runP2PLater(later);  // also what came due before a failure
    } catch (const std::exception& ex) {
      SMDCCL_WARN("send/recv connector: a completion failed: ", ex.what());
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Silent peers are probed every 100 ms; a dial asked for or ended, or
    // a handler leaving, starts a turn at once.
    connectorCv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return connectorPoked_; });
  }
}

}  // namespace smdccl
