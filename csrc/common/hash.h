#pragma once
// FNV-1a over 64-bit words: the fingerprints ranks compare (call shapes,
// group members, fused riders). Not for security: equal inputs give equal
// values on every rank of the same build, which is all they need.
#include <cstdint>

namespace smdccl {

struct Fnv1a {
  uint64_t value = 1469598103934665603ull;
  void mix(uint64_t v) { value = (value ^ v) * 1099511628211ull; }
};

}  // namespace smdccl
