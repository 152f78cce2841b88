// The SM cap's arithmetic (kernels/cuda/sm_cap.h), on the host: the grid
// the kernels launch covers the work, never exceeds one wave on the SMs
// they may use, and a cap only ever lowers that.
#include "check.h"
#include "kernels/cuda/sm_cap.h"

using namespace smdccl::cuda;

TEST(sm_cap_usable_sms) {
  CHECK(usableSms(132, 0) == 132);  // no cap: every SM
  CHECK(usableSms(132, 16) == 16);
  CHECK(usableSms(132, 500) == 132);  // a cap above the device is no cap
  CHECK(usableSms(0, 0) == 1);        // a device query that failed: one SM, not none
}

TEST(sm_cap_wave_blocks) {
  // Small work: just enough blocks.
  CHECK(waveBlocks(1, 512, 132, 4) == 1);
  CHECK(waveBlocks(513, 512, 132, 4) == 2);
  CHECK(waveBlocks(0, 512, 132, 4) == 1);
  // Large work: one wave on the usable SMs.
  CHECK(waveBlocks(size_t(1) << 30, 512, 132, 4) == 132 * 4);
  CHECK(waveBlocks(size_t(1) << 30, 512, usableSms(132, 16), 4) == 16 * 4);
  for (int cap : {0, 1, 8, 64, 132, 1000})
    for (size_t work : {size_t(1), size_t(1000), size_t(1) << 20, size_t(1) << 34}) {
      size_t capped = waveBlocks(work, 1024, usableSms(132, cap), 2);
      CHECK(capped >= 1 && capped <= waveBlocks(work, 1024, 132, 2));
      CHECK(capped <= static_cast<size_t>(usableSms(132, cap)) * 2);
    }
}

TEST(sm_cap_set_and_read) {
  int saved = maxSms();
  setMaxSms(24);
  CHECK(maxSms() == 24);
  setMaxSms(-3);  // nonsense reads as no cap
  CHECK(maxSms() == 0);
  setMaxSms(saved);
}
