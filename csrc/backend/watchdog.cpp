#include "backend/watchdog.h"

#include <sstream>
#include <vector>

#include "common/error.h"
#include "common/log.h"

namespace smdccl {

namespace {
constexpr auto kPoll = std::chrono::milliseconds(500);  // how often peers' questions are read
constexpr auto kAnswerWait = std::chrono::seconds(3);   // how long a question waits for answers
const char* kRequestKey = "smdccl/status/request";
std::string statusKey(int rank) { return strCat("smdccl/status/", rank); }
}  // namespace

Watchdog::Watchdog(KVStore& store, int rank, int size, std::string group, double warnAfterS)
    : store_(store), rank_(rank), size_(size), group_(std::move(group)), warnAfterS_(warnAfterS) {
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::opStarted(uint64_t seq, const char* name) {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = seq;
  runningName_ = name;
  runningSince_ = std::chrono::steady_clock::now();
}

void Watchdog::opFinished(uint64_t seq) {
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = seq;
}

Watchdog::Status Watchdog::parse(const std::string& s) {
  Status st;
  std::istringstream in(s);
  in >> st.request >> st.started >> st.finished >> st.name;
  if (!in) st.request = -1;
  return st;
}

void Watchdog::answer(int64_t request) {
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    value = strCat(request, " ", started_, " ", finished_, " ", runningName_);
    answered_ = request;
  }
  store_.set(statusKey(rank_), value);
}

void Watchdog::warn(uint64_t seq, const std::string& name, double waitedS) {
  int64_t request = store_.add(kRequestKey, 1);
  answer(request);
  std::vector<Status> st(static_cast<size_t>(size_));
  auto until = std::chrono::steady_clock::now() + kAnswerWait;
  while (true) {
    bool all = true;
    for (int r = 0; r < size_; ++r) {
      Status& s = st[static_cast<size_t>(r)];
      if (s.request >= request) continue;
      if (store_.check(statusKey(r))) s = parse(store_.get(statusKey(r), Deadline::after(kPoll)));
      if (s.request < request) all = false;
    }
    if (all || std::chrono::steady_clock::now() >= until) break;
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; })) return;
  }
  std::string in, done, missing, silent;
  auto add = [](std::string& list, const std::string& item) {
    list += (list.empty() ? "" : ", ") + item;
  };
  for (int r = 0; r < size_; ++r) {
    const Status& s = st[static_cast<size_t>(r)];
    if (s.request < request) add(silent, strCat(r));
    else if (s.finished >= seq) add(done, strCat(r));
    else if (s.started >= seq) add(in, strCat(r));
    else add(missing, strCat(r, " (last: #", s.started, " ", s.name,
                             s.finished >= s.started ? ", finished" : ", running", ")"));
  }
  std::string msg = strCat(name, " #", seq, " on group '", group_, "' has waited ",
                           static_cast<int64_t>(waitedS), " s (SMDCCL_WARN_AFTER=", warnAfterS_,
                           "): waiting in it: rank(s) ", in.empty() ? "none" : in);
  if (!done.empty()) msg += strCat("; done with it: ", done);
  msg += strCat("; not arrived: ", missing.empty() ? "none" : missing);
  if (!silent.empty()) msg += strCat("; no answer (dead, or its process is stuck): ", silent);
  SMDCCL_WARN(msg);
}

void Watchdog::loop() {
  int failures = 0;
  while (true) {
    uint64_t seq = 0;
    std::string name;
    double waited = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, kPoll, [&] { return stop_; })) return;
      if (warnAfterS_ > 0 && started_ > finished_ && warnedFor_ != started_) {
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - runningSince_)
                     .count();
        if (waited >= warnAfterS_) {
          seq = warnedFor_ = started_;
          name = runningName_;
        }
      }
    }
    try {
      int64_t request = store_.add(kRequestKey, 0);
      bool ask;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ask = request > answered_;
      }
      if (ask) answer(request);
      if (seq) warn(seq, name, waited);
      failures = 0;
    } catch (const std::exception& e) {
      // The store lives in rank 0's process: once it is gone there is no one
      // to ask. Say so once, then keep quiet.
      if (++failures == 3) SMDCCL_INFO("watchdog of group '", group_, "': store unreachable: ", e.what());
    }
  }
}

}  // namespace smdccl
