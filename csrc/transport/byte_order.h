#pragma once
// Little-endian fields of the wire frames (handshake, send/recv header), read
// and written byte by byte so that any alignment and any host order work.
#include <cstdint>

namespace smdccl {

// The n-byte (n <= 8) little-endian unsigned value at p.
inline uint64_t loadLE(const uint8_t* p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Writes the low n bytes (n <= 8) of v at p, little-endian.
inline void storeLE(uint8_t* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i, v >>= 8) p[i] = static_cast<uint8_t>(v);
}

}  // namespace smdccl
