#include "algorithms/stage_device.h"

#include "kernels/cpu/quantize.h"

namespace smdccl {

StageDevice::Ticket StageDevice::add(const Copy& c) {
  const int lane = c.out ? 0 : 1;
  const uint64_t number = ++queued_[lane];
  queue(lane, number, c);
  return (number << 1) | static_cast<Ticket>(lane);
}

size_t StageDevice::slotBytes(size_t count, const Unpack& how) {
  return how.int8 ? int8Bytes(count) : count * wireElementSize(how.dt, how.wire);
}

StageDevice::Ticket StageDevice::toHost(void* slot, const char* src, size_t count,
                                        const Unpack& how) {
  bytesToHost_ += slotBytes(count, how);
  return add(
      {.out = true, .slot = slot, .dev = const_cast<char*>(src), .count = count, .how = how});
}

StageDevice::Ticket StageDevice::fromHost(char* dst, const void* slot, size_t count,
                                          const Unpack& how) {
  bytesFromHost_ += slotBytes(count, how);
  return add({.out = false, .slot = const_cast<void*>(slot), .dev = dst, .count = count, .how = how});
}

bool StageDevice::done(Ticket t) { return ran(static_cast<int>(t & 1), t >> 1); }

}  // namespace smdccl
