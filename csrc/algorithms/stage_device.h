#pragma once
// The device half of a staged collective (staged_ring.h). The device moves
// data between its memory and pinned host slots, casting float32 to a 16-bit
// wire on the way out and widening (and reducing) on the way in; the proxy,
// the thread that runs the exchange, only ships slots over the links, as
// NCCL's network proxy does. Every call queues work and returns at once with
// a ticket; done() says whether that work has run.
//
// Implementations: CUDA streams and events (algorithms/cuda/), and
// HostStageDevice (host_stage_device.h), whose memory is host memory: the CI
// tests run the staged schedules with it, and the GPU run checks the CUDA
// one against it bit for bit.
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace smdccl {

class StageDevice {
 public:
  using Ticket = uint64_t;
  virtual ~StageDevice() = default;

  // slot = src[0, count) as `wire` carries dt data: the bytes themselves
  // (F32), or float32 rounded to fp16/bf16 (half the bytes).
  Ticket toHost(void* slot, const char* src, size_t count, DType dt, Wire wire) {
    bytesToHost_ += count * wireElementSize(dt, wire);
    return queueToHost(slot, src, count, dt, wire);
  }
  // What fromHost does with a slot's values: dt data as `wire` carries it,
  // widened; with `reduce`, dst op= them and float32 results are rounded to
  // `roundTo`'s precision (F32: not rounded), as Exchange::recvReduce does;
  // else dst = them.
  struct Unpack {
    DType dt;
    Wire wire = Wire::F32;
    bool reduce = false;
    RedOp op = RedOp::Sum;
    Wire roundTo = Wire::F32;
  };
  // dst[0, count) from the slot, as `how` says.
  Ticket fromHost(char* dst, const void* slot, size_t count, const Unpack& how) {
    bytesFromHost_ += count * wireElementSize(how.dt, how.wire);
    return queueFromHost(dst, slot, count, how);
  }
  // Whether the work behind `t` has run (never blocks).
  virtual bool done(Ticket t) = 0;

  // Bytes this device has copied out to host slots and in from them: what
  // crosses PCIe on a GPU.
  uint64_t bytesToHost() const { return bytesToHost_; }
  uint64_t bytesFromHost() const { return bytesFromHost_; }

  // Whether dt data is cast to 16 bits on `wire` (a 16-bit wire carries float32 only).
  static bool packed(DType dt, Wire wire) { return dt == DType::F32 && wire != Wire::F32; }
  // Bytes of one element of dt data on `wire`.
  static size_t wireElementSize(DType dt, Wire wire) {
    return packed(dt, wire) ? 2 : elementSize(dt);
  }

 protected:
  virtual Ticket queueToHost(void* slot, const char* src, size_t count, DType dt, Wire wire) = 0;
  virtual Ticket queueFromHost(char* dst, const void* slot, size_t count, const Unpack& how) = 0;

 private:
  uint64_t bytesToHost_ = 0, bytesFromHost_ = 0;
};

}  // namespace smdccl
