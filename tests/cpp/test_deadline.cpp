// Deadlines from the group's timeout (common/deadline.h): a timeout too long
// for the clock (torch takes timedelta.max) must not wrap into the past and
// fail every wait at once.
#include <chrono>

#include "check.h"
#include "common/deadline.h"
#include "common/steady_clock.h"

using namespace smdccl;
using namespace std::chrono;

TEST(deadline_after_a_huge_timeout_is_never) {
  // timedelta(days=365 * 1000) and timedelta.max, in milliseconds
  for (milliseconds d :
       {milliseconds(hours(24 * 365 * 1000)), milliseconds(86'399'999'999'999'999)}) {
    const Deadline dl = Deadline::after(d);
    CHECK(!dl.expired());
    CHECK(dl.at() == Deadline::Clock::time_point::max());
    CHECK(dl.remaining() > hours(24));
  }
}

TEST(deadline_after_an_ordinary_timeout_ends_then) {
  const auto before = Deadline::Clock::now();
  const Deadline dl = Deadline::after(minutes(30));
  CHECK(!dl.expired());
  CHECK(dl.at() >= before + minutes(30) && dl.at() <= Deadline::Clock::now() + minutes(30));
  CHECK(Deadline::after(milliseconds(0)).expired());
  CHECK(Deadline::after(milliseconds(-5)).expired());
}

TEST(duration_ns_saturates_at_a_century) {
  CHECK(durationNs(milliseconds(1500)) == 1'500'000'000);
  const int64_t century = durationNs(hours(24 * 365 * 100));
  CHECK(durationNs(milliseconds(86'399'999'999'999'999)) == century);
  CHECK(century + 1'000'000'000 > century);  // room to add to it
}
