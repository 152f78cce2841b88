#pragma once
// What the ops whose GPU work is watched (cuda/stream_watch.h) learn when
// that work fails after they returned: each op's WatchedFailure, and the
// set a watched collective tells, which holds the op and every op fused
// into it (their Works all end with that collective's GPU work).
// CUDA-free, so that the host tests check the set.
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace smdccl {

// Set once by the watch's thread: read `message` only once `failed` reads true.
struct WatchedFailure {
  std::atomic<bool> failed{false};
  std::string message;
};

// The failures of the collective running on the progress thread: an op
// joins with its sequence number as it starts (prepare); ops fused into
// a collective start inside it, with its number, and join its set; another
// number (or 0, an unnumbered op) starts a new set.
class OpFailures {
 public:
  void join(uint64_t seq, std::shared_ptr<WatchedFailure> f) {
    if (seq == 0 || seq != seq_) all_.clear();
    seq_ = seq;
    all_.push_back(std::move(f));
  }
  const std::vector<std::shared_ptr<WatchedFailure>>& all() const { return all_; }

 private:
  uint64_t seq_ = 0;
  std::vector<std::shared_ptr<WatchedFailure>> all_;
};

// Tells each of `fs` not told before (once per op) that its work failed: `why`.
inline void tellFailed(const std::vector<std::shared_ptr<WatchedFailure>>& fs,
                       const std::string& why) {
  for (const auto& f : fs)
    if (f && !f->failed.load(std::memory_order_relaxed)) {
      f->message = why;
      f->failed.store(true, std::memory_order_release);
    }
}

}  // namespace smdccl
