#include "kernels/cpu/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace smdccl {

void streamCopy(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  char* d = static_cast<char*>(dst);
  const char* s = static_cast<const char*>(src);
  // Non-temporal stores need 16-byte aligned addresses: the head plainly.
  size_t i = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
  if (i > n) i = n;
  std::memcpy(d, s, i);
  auto load = [s](size_t at) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + at)); };
  auto store = [d](size_t at, __m128i v) {
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + at), v);
  };
  for (; i + 64 <= n; i += 64) {  // a whole line per round: the write-combining buffer fills
    __m128i a = load(i), b = load(i + 16), c = load(i + 32), e = load(i + 48);
    store(i, a);
    store(i + 16, b);
    store(i + 32, c);
    store(i + 48, e);
  }
  for (; i + 16 <= n; i += 16) store(i, load(i));
  std::memcpy(d + i, s + i, n - i);
  _mm_sfence();  // non-temporal stores are weakly ordered
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace smdccl
