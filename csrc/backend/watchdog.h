#pragma once
// Watches the collective this rank is running. Once it has waited longer
// than SMDCCL_WARN_AFTER seconds, the watchdog asks every rank of the group
// (through the store) what it is doing and logs who has arrived and who has
// not. It also answers such questions for its peers from its own thread, so
// a rank busy elsewhere (computing, in Python, in another group) still says
// which collective it reached last.
#include <cstdint>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <memory>
#include <thread>
#include <vector>

#include "common/store.h"

namespace smdccl {

class Watchdog {
 public:
  // warnAfterS <= 0: never warn (questions from peers are still answered).
  Watchdog(std::shared_ptr<KVStore> store, int rank, int size, std::string group,
           double warnAfterS);
  // Stops the thread. It may be inside a store call that waits on a stuck
  // store server: after a short wait it is left to finish on its own (it
  // owns what it uses), so destroying a group never hangs on it.
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // Asks the group's ranks (through the store, waiting up to `answerWait`
  // for their answers; they look every 0.5 s) what each of `ranks` last ran,
  // e.g. "rank 2: last ran allreduce #4, still running; rank 3: no answer
  // (...)". Any thread.
  std::string describeRanks(const std::vector<int>& ranks, std::chrono::milliseconds answerWait);

  void opStarted(uint64_t seq, const char* name);
  void opFinished(uint64_t seq);

 private:
  struct State;  // shared with the thread
  std::shared_ptr<State> st_;
};

}  // namespace smdccl
