#pragma once
// Now on the steady clock, in nanoseconds: for durations and for times kept
// in atomics (a time_point is not lock-free everywhere).
#include <chrono>
#include <cstdint>

namespace smdccl {

inline int64_t steadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// `d` in nanoseconds, at most a century: a group timeout of timedelta.max
// would overflow (and sums of it with other durations must not).
inline int64_t durationNs(std::chrono::milliseconds d) {
  constexpr int64_t kCenturyMs = 100LL * 365 * 24 * 3600 * 1000;
  return (d.count() < kCenturyMs ? d.count() : kCenturyMs) * 1'000'000;
}

}  // namespace smdccl
