#pragma once
// Bytes as lowercase hex: how binary handles (CUDA IPC handles, NCCL
// unique ids, group tokens) travel through the c10d store's string values.
#include <cstddef>
#include <string>

namespace smdccl {

inline std::string toHex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

// Whether `s` is exactly n bytes of lowercase hex; if so they are in p
// (else p may hold part of them).
inline bool fromHex(const std::string& s, void* p, size_t n) {
  auto nibble = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (s.size() != 2 * n) return false;
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    b[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  return true;
}

}  // namespace smdccl
