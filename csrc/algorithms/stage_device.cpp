#include "algorithms/stage_device.h"

#include <stdexcept>

#include "common/error.h"

namespace smdccl {

namespace {
int laneOf(StageDevice::Ticket t) { return static_cast<int>(t & 1); }
uint64_t numberOf(StageDevice::Ticket t) { return t >> 1; }
}  // namespace

StageDevice::Ticket StageDevice::plan(const Copy& c) {
  const int lane = c.out ? 0 : 1;
  Lane& l = lanes_[lane];
  const uint64_t number = ++l.planned;
  l.ready.push_back(false);
  planned(lane, number, c);
  return (number << 1) | static_cast<Ticket>(lane);
}

StageDevice::Ticket StageDevice::planToHost(void* slot, const char* src, size_t count, DType dt,
                                            Wire wire) {
  bytesToHost_ += count * wireElementSize(dt, wire);
  return plan({.out = true,
               .slot = slot,
               .dev = const_cast<char*>(src),
               .count = count,
               .how = {.dt = dt, .wire = wire}});
}

StageDevice::Ticket StageDevice::planFromHost(char* dst, const void* slot, size_t count,
                                              const Unpack& how) {
  bytesFromHost_ += count * wireElementSize(how.dt, how.wire);
  return plan(
      {.out = false, .slot = const_cast<void*>(slot), .dev = dst, .count = count, .how = how});
}

void StageDevice::go(Ticket t) {
  Lane& l = lanes_[laneOf(t)];
  const uint64_t n = numberOf(t);
  if (n <= l.released) return;  // let go already (abandon())
  if (n > l.planned)
    throw std::logic_error(strCat("StageDevice::go: copy ", n, " was never planned"));
  l.ready[n - l.released - 1] = true;
  // A lane runs in plan order: a copy whose turn has not come waits for
  // the ones before it (its stream could not run it earlier anyway).
  uint64_t upTo = l.released;
  while (!l.ready.empty() && l.ready.front()) {
    l.ready.pop_front();
    ++upTo;
  }
  if (upTo == l.released) return;
  l.released = upTo;
  release(laneOf(t), upTo);
}

bool StageDevice::done(Ticket t) {
  const Lane& l = lanes_[laneOf(t)];
  const uint64_t n = numberOf(t);
  return n <= l.released && ran(laneOf(t), n);
}

void StageDevice::abandon() {
  for (int lane = 0; lane < 2; ++lane) {
    Lane& l = lanes_[lane];
    if (l.planned == l.released) continue;
    dropPlanned(lane, l.released, l.planned);
    l.released = l.planned;
    l.ready.clear();
  }
}

}  // namespace smdccl
