#pragma once
// A StageDevice whose copies never run: the staged schedules' tests use it
// to see their waits run into the deadline, or stop on an abort.
#include <cstdint>

#include "algorithms/stage_device.h"

namespace smdccl::testing {

class StuckStageDevice final : public StageDevice {
 protected:
  void queue(int, uint64_t, const Copy&) override {}
  bool ran(int, uint64_t) override { return false; }
};

}  // namespace smdccl::testing
