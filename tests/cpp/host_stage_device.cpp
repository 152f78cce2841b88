#include "host_stage_device.h"

#include <cstring>

#include "kernels/cpu/reduce.h"

namespace smdccl {

void HostStageDevice::run(const Copy& c) {
  const DType dt = c.how.dt;
  const Wire wire = c.how.wire;
  float* f = reinterpret_cast<float*>(c.dev);
  if (c.out) {
    if (packed(dt, wire)) packToWire(c.slot, f, c.count, wire);
    else std::memcpy(c.slot, c.dev, c.count * elementSize(dt));
  } else if (packed(dt, wire)) {
    unpackFromWire(f, c.slot, c.count, wire);
  } else {
    std::memcpy(c.dev, c.slot, c.count * elementSize(dt));
  }
}

void HostStageDevice::planned(int lane, uint64_t, const Copy& c) {
  lanes_[lane].planned.push_back(c);
}

void HostStageDevice::release(int lane, uint64_t number) {
  Lane& l = lanes_[lane];
  // Copies ran + pending.size() + 1 .. number come off the plan.
  while (l.ran + l.pending.size() < number) {
    Copy c = l.planned.front();
    l.planned.pop_front();
    if (mode_ == Mode::Immediate) {
      run(c);
      ++l.ran;
    } else {
      l.pending.push_back(c);
    }
  }
}

bool HostStageDevice::ran(int lane, uint64_t number) {
  Lane& l = lanes_[lane];
  // Deferred: one copy per poll, so the proxy sees work in flight.
  if (l.ran < number && !l.pending.empty()) {
    run(l.pending.front());
    l.pending.pop_front();
    ++l.ran;
  }
  return l.ran >= number;
}

void HostStageDevice::dropPlanned(int lane, uint64_t, uint64_t planned) {
  Lane& l = lanes_[lane];
  // Released ones are on the device's stream already: they still run, as
  // on a GPU; the others never will. Numbers go on after them.
  while (!l.pending.empty()) {
    run(l.pending.front());
    l.pending.pop_front();
  }
  l.planned.clear();
  l.ran = planned;
}

}  // namespace smdccl
