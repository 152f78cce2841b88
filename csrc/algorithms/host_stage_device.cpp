#include "algorithms/host_stage_device.h"

#include <cstring>

#include "kernels/cpu/reduce.h"

namespace smdccl {

StageDevice::Ticket HostStageDevice::queue(int q, std::function<void()> work) {
  Queue& Q = queues_[q];
  Ticket t = (++Q.queued << 1) | static_cast<Ticket>(q);
  if (!deferred_) {
    work();
    ++Q.ran;
  } else {
    Q.pending.push_back(std::move(work));
  }
  return t;
}

bool HostStageDevice::done(Ticket t) {
  Queue& Q = queues_[queueOf(t)];
  // One step per poll: the proxy sees work in flight, as with a GPU.
  if (Q.ran < numberOf(t) && !Q.pending.empty()) {
    auto work = std::move(Q.pending.front());
    Q.pending.pop_front();
    work();
    ++Q.ran;
  }
  return Q.ran >= numberOf(t);
}

StageDevice::Ticket HostStageDevice::queueToHost(void* slot, const char* src, size_t count,
                                                 DType dt, Wire wire) {
  return queue(0, [=] {
    if (packed(dt, wire)) packToWire(slot, reinterpret_cast<const float*>(src), count, wire);
    else std::memcpy(slot, src, count * elementSize(dt));
  });
}

StageDevice::Ticket HostStageDevice::queueFromHost(char* dst, const void* slot, size_t count,
                                                   const Unpack& how) {
  const DType dt = how.dt;
  const Wire wire = how.wire, roundTo = how.roundTo;
  const bool reduce = how.reduce;
  const RedOp op = how.op;
  return queue(1, [=] {
    float* f = reinterpret_cast<float*>(dst);
    if (!reduce) {
      if (packed(dt, wire)) unpackFromWire(f, slot, count, wire);
      else std::memcpy(dst, slot, count * elementSize(dt));
    } else if (packed(dt, wire)) {
      reduceFromWire(f, slot, count, {wire, op, roundTo});
    } else {
      reduceInto(dst, slot, count, dt, op);
      if (dt == DType::F32) roundToWire(f, count, roundTo);
    }
  });
}

}  // namespace smdccl
