// The staging buffer's sizing (transport/staging_sizer.h), on the host:
// growth covers the request at once, shrinking waits for a full window of
// small requests after a burst, and the result always fits the request.
#include <cstddef>
#include <cstdint>

#include "check.h"
#include "transport/staging_sizer.h"

using smdccl::StagingSizer;

namespace {
constexpr size_t MiB = size_t(1) << 20;
}

TEST(staging_sizer_grows_to_whole_mib_and_by_half) {
  StagingSizer s(8);
  CHECK(s.fit(0, 1) == MiB);
  CHECK(s.fit(0, 3 * MiB + 1) == 4 * MiB);
  CHECK(s.fit(4 * MiB, 4 * MiB + 1) == 6 * MiB);  // by half at least
  CHECK(s.fit(4 * MiB, 20 * MiB) == 20 * MiB);
  CHECK(s.fit(4 * MiB, 4 * MiB) == 4 * MiB);  // fits: stays
}

TEST(staging_sizer_shrinks_after_a_window_of_small_requests) {
  StagingSizer s(4);
  size_t cap = s.fit(0, 256 * MiB);  // the burst
  CHECK(cap == 256 * MiB);
  // Three small requests: not a full window yet.
  for (int i = 0; i < 3; ++i) {
    cap = s.fit(cap, 2 * MiB + i);
    CHECK(cap == 256 * MiB);
  }
  // The fourth ends the window: down to its largest request, rounded up.
  cap = s.fit(cap, MiB);
  CHECK(cap == 3 * MiB);
  // A new window at the new size: nothing more to shrink.
  for (int i = 0; i < 8; ++i) cap = s.fit(cap, 2 * MiB);
  CHECK(cap == 3 * MiB);
}

TEST(staging_sizer_keeps_a_buffer_that_is_used) {
  StagingSizer s(4);
  size_t cap = s.fit(0, 64 * MiB);
  // One large request in each window keeps it: more than a quarter used.
  for (int w = 0; w < 5; ++w)
    for (int i = 0; i < 4; ++i) cap = s.fit(cap, i == 2 ? 17 * MiB : MiB);
  CHECK(cap == 64 * MiB);
  // A quarter exactly is idle enough.
  for (int i = 0; i < 4; ++i) cap = s.fit(cap, 16 * MiB);
  CHECK(cap == 16 * MiB);
}

TEST(staging_sizer_growth_restarts_the_window) {
  StagingSizer s(4);
  size_t cap = s.fit(0, 8 * MiB);
  cap = s.fit(cap, MiB);
  cap = s.fit(cap, MiB);
  cap = s.fit(cap, 100 * MiB);  // a burst inside the window
  CHECK(cap == 100 * MiB);
  for (int i = 0; i < 3; ++i) CHECK((cap = s.fit(cap, MiB)) == 100 * MiB);
  CHECK((cap = s.fit(cap, MiB)) == MiB);
}

TEST(staging_sizer_window_zero_never_shrinks) {
  StagingSizer s(0);
  size_t cap = s.fit(0, 512 * MiB);
  for (int i = 0; i < 1000; ++i) cap = s.fit(cap, 1);
  CHECK(cap == 512 * MiB);
}

TEST(staging_sizer_result_always_fits) {
  // Any sequence: the capacity returned holds the request it was asked for.
  uint64_t x = 12345;
  for (int window : {0, 1, 3, 64}) {
    StagingSizer s(window);
    size_t cap = 0;
    for (int i = 0; i < 5000; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      size_t request = (x >> 33) % ((x >> 20) % 7 == 0 ? 300 * MiB : 3 * MiB);
      cap = s.fit(cap, request);
      CHECK(cap >= request);
      CHECK(cap % MiB == 0 || cap == 0);
    }
  }
}
