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

}  // namespace smdccl
