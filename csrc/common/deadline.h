#pragma once
// A point in time after which a blocking wait gives up. Every wait in the
// library takes one, derived from the group's timeout.
#include <chrono>

namespace smdccl {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  // A timeout past the clock's range (torch takes timedelta.max) is no
  // deadline, not one that wrapped into the past.
  static Deadline after(std::chrono::milliseconds d) {
    const auto now = Clock::now();
    if (d >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now))
      return never();
    return Deadline(now + d);
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  static Deadline until(Clock::time_point t) { return Deadline(t); }
  Deadline() : at_(Clock::time_point::max()) {}  // never
  bool expired() const { return Clock::now() >= at_; }
  std::chrono::milliseconds remaining() const {
    auto now = Clock::now();
    if (now >= at_) return std::chrono::milliseconds(0);
    if (at_ == Clock::time_point::max()) return std::chrono::hours(24 * 365);
    return std::chrono::duration_cast<std::chrono::milliseconds>(at_ - now);
  }
  Clock::time_point at() const { return at_; }

 private:
  explicit Deadline(Clock::time_point at) : at_(at) {}
  Clock::time_point at_;
};

}  // namespace smdccl
