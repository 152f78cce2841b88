#include "transport/staging_sizer.h"

#include <algorithm>

namespace smdccl {

size_t StagingSizer::fit(size_t capacity, size_t request) {
  if (request > capacity) {
    // A growth starts a new window: the burst is what it measures from.
    seen_ = 0;
    peak_ = 0;
    return roundUp(std::max(request, capacity + capacity / 2));
  }
  peak_ = std::max(peak_, request);
  if (window_ <= 0 || ++seen_ < window_) return capacity;
  size_t want = std::max(roundUp(peak_), kGranule);
  seen_ = 0;
  peak_ = 0;
  // Only worth a reallocation (pinning is slow) when most of it sat idle.
  return want * 4 <= capacity ? want : capacity;
}

}  // namespace smdccl
