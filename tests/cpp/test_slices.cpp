// The two-shot split of the CUDA allreduce (algorithms/slices.h).
#include "algorithms/slices.h"
#include "check.h"

using namespace smdccl;

TEST(slices_cover_in_order_aligned) {
  for (size_t es : {1, 2, 4, 8})
    for (int parts : {1, 2, 3, 4, 7, 8, 16})
      for (size_t count : {0, 1, 3, 15, 16, 17, 1000, 1001, 300007, 1 << 20}) {
        Slices s(count, parts, es);
        CHECK(static_cast<int>(s.begin.size()) == parts && s.end.size() == s.begin.size());
        size_t at = 0;
        for (int q = 0; q < parts; ++q) {
          CHECK(s.begin[q] == at);  // no gap, no overlap
          CHECK(s.end[q] >= s.begin[q]);
          // every boundary inside the buffer is on 16 bytes
          if (s.begin[q] < count) CHECK((s.begin[q] * es) % 16 == 0);
          at = s.end[q];
        }
        CHECK(at == count);  // covers it all
      }
}

TEST(slices_balanced_up_to_alignment) {
  Slices s(1000, 4, 4);  // 250 each, rounded up to 4 elements (16 bytes)
  CHECK(s.end[0] - s.begin[0] == 252);
  CHECK(s.end[3] - s.begin[3] == 1000 - 3 * 252);
}
