#include "host_stage_device.h"

#include <cstring>

#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

void HostStageDevice::run(const Copy& c) {
  const DType dt = c.how.dt;
  const Wire wire = c.how.wire;
  float* f = reinterpret_cast<float*>(c.dev);
  if (c.how.int8) {
    if (c.out) quantizeInt8(c.slot, f, c.count);
    else dequantizeInt8(f, c.slot, c.count);
    return;
  }
  if (c.out) {
    if (packed(dt, wire)) packToWire(c.slot, f, c.count, wire);
    else std::memcpy(c.slot, c.dev, c.count * elementSize(dt));
  } else if (packed(dt, wire)) {
    unpackFromWire(f, c.slot, c.count, wire);
  } else {
    std::memcpy(c.dev, c.slot, c.count * elementSize(dt));
  }
}

void HostStageDevice::queue(int lane, uint64_t, const Copy& c) {
  Lane& l = lanes_[lane];
  if (mode_ != Mode::Immediate) {
    l.pending.push_back(c);
    return;
  }
  run(c);
  ++l.ran;
}

bool HostStageDevice::ran(int lane, uint64_t number) {
  Lane& l = lanes_[lane];
  // Deferred: one copy per poll, so the proxy sees work in flight.
  if (l.ran < number && !l.pending.empty()) {
    if (mode_ == Mode::Lagging && lane == 1 && ++l.polls < kLagPolls) return false;
    l.polls = 0;
    run(l.pending.front());
    l.pending.pop_front();
    ++l.ran;
  }
  return l.ran >= number;
}

void HostStageDevice::abandon() {
  for (Lane& l : lanes_)
    for (; !l.pending.empty(); ++l.ran) {
      run(l.pending.front());
      l.pending.pop_front();
    }
}

}  // namespace smdccl
