#include "backend/watchdog.h"

#include <cstdint>
#include <algorithm>
#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"

namespace smdccl {

namespace {
constexpr auto kPoll = std::chrono::milliseconds(500);  // how often peers' questions are read
constexpr auto kAnswerWait = std::chrono::seconds(3);   // how long a question waits for answers
constexpr auto kMaxBackoff = std::chrono::milliseconds(60000);  // between tries of a failing store
const char* kRequestKey = "smdccl/status/request";
std::string statusKey(int rank) { return strCat("smdccl/status/", rank); }
}  // namespace

struct Watchdog::State {
  std::shared_ptr<KVStore> store;
  int rank = 0, size = 1;
  std::string group;
  double warnAfterS = 0;

  std::mutex answerMu;  // answer(): one writer of this rank's status at a time
  std::mutex mu;        // guards the fields below and wakes the thread
  std::condition_variable cv;
  bool stop = false, exited = false;
  uint64_t started = 0, finished = 0, warnedFor = 0;
  std::string runningName = "-";
  std::chrono::steady_clock::time_point runningSince;
  int64_t answered = 0;

  struct Status {
    int64_t request = -1;
    uint64_t started = 0, finished = 0;
    std::string name;
  };
  static Status parse(const std::string& s) {
    Status st;
    std::istringstream in(s);
    in >> st.request >> st.started >> st.finished >> st.name;
    if (!in) st.request = -1;
    return st;
  }
  void loop();
  void answer(int64_t request);
  // Posts a question, answers it, and collects the ranks' answers, waiting
  // up to `answerWait` for those of `needed` (all ranks if empty); a rank
  // without an answer has request -1.
  std::vector<Status> ask(std::chrono::milliseconds answerWait,
                          const std::vector<int>& needed = {});
  void warn(uint64_t seq, const std::string& name, double waitedS);
};

Watchdog::Watchdog(std::shared_ptr<KVStore> store, int rank, int size, std::string group,
                   double warnAfterS)
    : st_(std::make_shared<State>()) {
  st_->store = std::move(store);
  st_->rank = rank;
  st_->size = size;
  st_->group = std::move(group);
  st_->warnAfterS = warnAfterS;
  std::thread([st = st_] {
    st->loop();
    std::lock_guard<std::mutex> lock(st->mu);
    st->exited = true;
    st->cv.notify_all();
  }).detach();
}

Watchdog::~Watchdog() {
  std::unique_lock<std::mutex> lock(st_->mu);
  st_->stop = true;
  st_->cv.notify_all();
  st_->cv.wait_for(lock, std::chrono::seconds(2), [&] { return st_->exited; });
}

void Watchdog::opStarted(uint64_t seq, const char* name) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->started = seq;
  st_->runningName = name;
  st_->runningSince = std::chrono::steady_clock::now();
}

void Watchdog::opFinished(uint64_t seq) {
  std::lock_guard<std::mutex> lock(st_->mu);
  st_->finished = seq;
}

void Watchdog::State::answer(int64_t request) {
  // The watchdog thread and a caller's describeRanks() may answer at once:
  // one at a time, and never an older question after a newer one (that
  // would make this rank look silent to whoever asked the newer).
  std::lock_guard<std::mutex> one(answerMu);
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (request <= answered) return;
    value = strCat(request, " ", started, " ", finished, " ", runningName);
    answered = request;
  }
  store->set(statusKey(rank), value);
}

std::vector<Watchdog::State::Status> Watchdog::State::ask(std::chrono::milliseconds answerWait,
                                                          const std::vector<int>& needed) {
  int64_t request = store->add(kRequestKey, 1);
  answer(request);
  std::vector<Status> got(static_cast<size_t>(size));
  std::vector<int> ranks = needed;
  if (ranks.empty())
    for (int r = 0; r < size; ++r) ranks.push_back(r);
  auto until = std::chrono::steady_clock::now() + answerWait;
  while (true) {
    bool all = true;
    for (int r : ranks) {
      if (r < 0 || r >= size) continue;
      Status& s = got[static_cast<size_t>(r)];
      if (s.request >= request) continue;
      if (store->check(statusKey(r))) s = parse(store->get(statusKey(r), Deadline::after(kPoll)));
      if (s.request < request) all = false;
    }
    if (all || std::chrono::steady_clock::now() >= until) break;
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop; })) break;
  }
  for (auto& s : got)
    if (s.request < request) s.request = -1;  // an answer to an older question
  return got;
}

std::string Watchdog::describeRanks(const std::vector<int>& ranks,
                                    std::chrono::milliseconds answerWait) {
  std::vector<State::Status> got = st_->ask(answerWait, ranks);
  std::string out;
  for (int r : ranks) {
    if (r < 0 || r >= st_->size) continue;
    const State::Status& s = got[static_cast<size_t>(r)];
    out += strCat(out.empty() ? "" : "; ", "rank ", r, ": ");
    if (s.request < 0)
      out += strCat("no answer within ", answerWait.count(),
                    " ms (dead, its process stuck, or its watchdog busy)");
    else if (s.started == 0) out += "has run no collective on this group";
    else
      out += strCat("last ran ", s.name, " #", s.started,
                    s.finished >= s.started ? ", finished" : ", still running");
  }
  return out;
}

void Watchdog::State::warn(uint64_t seq, const std::string& name, double waitedS) {
  std::vector<Status> got = ask(kAnswerWait);
  {
    std::lock_guard<std::mutex> lock(mu);
    if (stop) return;
  }
  std::string in, done, missing, silent;
  auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  for (int r = 0; r < size; ++r) {
    const Status& s = got[static_cast<size_t>(r)];
    if (s.request < 0) add(silent, strCat(r));
    else if (s.finished >= seq) add(done, strCat(r));
    else if (s.started >= seq) add(in, strCat(r));
    else
      add(missing, strCat(r, " (last: #", s.started, " ", s.name,
                          s.finished >= s.started ? ", finished" : ", running", ")"));
  }
  std::string msg = strCat(name, " #", seq, " on group '", group, "' has waited ",
                           static_cast<int64_t>(waitedS), " s (SMDCCL_WARN_AFTER=", warnAfterS,
                           "): waiting in it: rank(s) ", in.empty() ? "none" : in);
  if (!done.empty()) msg += strCat("; done with it: ", done);
  msg += strCat("; not arrived: ", missing.empty() ? "none" : missing);
  if (!silent.empty()) msg += strCat("; no answer (dead, or its process is stuck): ", silent);
  SMDCCL_WARN(msg);
}

void Watchdog::State::loop() {
  int failures = 0;
  while (true) {
    uint64_t seq = 0;
    std::string name;
    double waited = 0;
    // While the store fails, ask less and less often: each failed call makes
    // torch's store client log a warning with a stack trace.
    auto interval = std::min(kMaxBackoff, kPoll * (1 << std::min(failures, 7)));
    {
      std::unique_lock<std::mutex> lock(mu);
      if (cv.wait_for(lock, interval, [&] { return stop; })) return;
      if (warnAfterS > 0 && started > finished && warnedFor != started) {
        waited =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - runningSince).count();
        if (waited >= warnAfterS) {
          seq = warnedFor = started;
          name = runningName;
        }
      }
    }
    try {
      int64_t request = store->add(kRequestKey, 0);
      bool ask;
      {
        std::lock_guard<std::mutex> lock(mu);
        ask = request > answered;
      }
      if (ask) answer(request);
      if (seq) warn(seq, name, waited);
      failures = 0;
    } catch (const std::exception& e) {
      // The store lives in rank 0's process: once it is gone there is no one
      // to ask. Say so once, then keep quiet (and back off, above).
      if (++failures == 3)
        SMDCCL_INFO("watchdog of group '", group, "': store unreachable: ", e.what());
    }
  }
}

}  // namespace smdccl
