#pragma once
// Watches the collective this rank is running. Once it has waited longer
// than SMDCCL_WARN_AFTER seconds, the watchdog asks every rank of the group
// (through the store) what it is doing and logs who has arrived and who has
// not. It also answers such questions for its peers from its own thread, so
// a rank busy elsewhere (computing, in Python, in another group) still says
// which collective it reached last.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "common/store.h"

namespace smdccl {

class Watchdog {
 public:
  // warnAfterS <= 0: never warn (questions from peers are still answered).
  Watchdog(KVStore& store, int rank, int size, std::string group, double warnAfterS);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void opStarted(uint64_t seq, const char* name);
  void opFinished(uint64_t seq);

 private:
  struct Status {
    int64_t request = -1;
    uint64_t started = 0, finished = 0;
    std::string name;
  };
  void loop();
  void answer(int64_t request);
  void warn(uint64_t seq, const std::string& name, double waitedS);
  static Status parse(const std::string& s);

  KVStore& store_;
  const int rank_, size_;
  const std::string group_;
  const double warnAfterS_;

  std::mutex mu_;  // guards the fields below and wakes the thread
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t started_ = 0, finished_ = 0, warnedFor_ = 0;
  std::string runningName_ = "-";
  std::chrono::steady_clock::time_point runningSince_;
  int64_t answered_ = 0;
  std::thread thread_;
};

}  // namespace smdccl
