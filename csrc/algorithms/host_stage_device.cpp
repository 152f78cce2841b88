#include "algorithms/host_stage_device.h"

#include <cstring>

#include "kernels/cpu/reduce.h"

namespace smdccl {

HostStageDevice::HostStageDevice(Mode mode) : mode_(mode) {
  if (!gated()) return;
  for (Lane& l : lanes_) {
    if (mode == Mode::Gated || !lanes_[0].queue) l.queue = std::make_shared<HostFlagQueue>();
    else l.queue = lanes_[0].queue;  // one queue for both lanes
    l.gated = std::make_unique<GatedLane>(*l.queue, &l.flags[0], &l.flags[1]);
  }
}

HostStageDevice::~HostStageDevice() {
  if (!gated()) return;
  // A schedule that failed may have left copies behind closed gates, or
  // running: nothing of them may outlive the memory they use.
  abandon();
  for (Lane& l : lanes_) l.queue->drain(Deadline::never());
}

void HostStageDevice::run(const Copy& c) {
  const DType dt = c.how.dt;
  const Wire wire = c.how.wire;
  float* f = reinterpret_cast<float*>(c.dev);
  if (c.out) {
    if (packed(dt, wire)) packToWire(c.slot, f, c.count, wire);
    else std::memcpy(c.slot, c.dev, c.count * elementSize(dt));
  } else if (!c.how.reduce) {
    if (packed(dt, wire)) unpackFromWire(f, c.slot, c.count, wire);
    else std::memcpy(c.dev, c.slot, c.count * elementSize(dt));
  } else if (packed(dt, wire)) {
    reduceFromWire(f, c.slot, c.count, {wire, c.how.op, c.how.roundTo});
  } else {
    reduceInto(c.dev, c.slot, c.count, dt, c.how.op);
    if (dt == DType::F32) roundToWire(f, c.count, c.how.roundTo);
  }
}

void HostStageDevice::planned(int lane, uint64_t number, const Copy& c) {
  Lane& l = lanes_[lane];
  if (gated()) l.gated->queue(number, [&] { l.queue->run([c] { run(c); }); });
  else l.planned.push_back(c);
}

void HostStageDevice::release(int lane, uint64_t number) {
  Lane& l = lanes_[lane];
  if (gated()) {
    l.gated->release(number);
    return;
  }
  // Ungated: copies ran + pending.size() + 1 .. number come off the plan.
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
  if (gated()) return l.gated->ran(number);
  // Deferred: one copy per poll, so the proxy sees work in flight.
  if (l.ran < number && !l.pending.empty()) {
    run(l.pending.front());
    l.pending.pop_front();
    ++l.ran;
  }
  return l.ran >= number;
}

void HostStageDevice::dropPlanned(int lane, uint64_t released, uint64_t planned) {
  Lane& l = lanes_[lane];
  if (gated()) {
    l.gated->release(planned);  // they run, as on a GPU, so that nothing waits for them
    return;
  }
  // Released ones are on the device's stream already: they still run, as
  // on a GPU; the others never will. Numbers go on after them.
  (void)released;
  while (!l.pending.empty()) {
    run(l.pending.front());
    l.pending.pop_front();
  }
  l.planned.clear();
  l.ran = planned;
}

}  // namespace smdccl
