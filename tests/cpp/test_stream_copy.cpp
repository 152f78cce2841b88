// The copy with non-temporal stores (kernels/cpu/stream_copy.h): every byte
// where memcpy would put it, for every alignment of both ends and sizes
// around the 16-byte stores and the 64-byte rounds, and nothing outside.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "check.h"
#include "kernels/cpu/stream_copy.h"

TEST(stream_copy_equals_memcpy_at_every_alignment) {
  std::vector<uint8_t> src(4096 + 64), dst(4096 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  const size_t sizes[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000, 4096};
  int bad = 0;
  for (size_t n : sizes)
    for (size_t d = 0; d < 16; ++d)
      for (size_t s = 0; s < 16; s += 5) {
        std::fill(dst.begin(), dst.end(), uint8_t{0xA5});
        smdccl::streamCopy(dst.data() + 32 + d, src.data() + s, n);
        for (size_t i = 0; i < dst.size(); ++i) {
          const bool inside = i >= 32 + d && i < 32 + d + n;
          const uint8_t want = inside ? src[s + i - 32 - d] : uint8_t{0xA5};
          bad += dst[i] != want;
        }
      }
  CHECK(bad == 0);
}
