#pragma once
// The device half of a staged collective (staged_rounds.h). The device
// moves data between its memory and pinned host slots, casting float32 to
// a 16-bit wire on the way out and widening it on the way in; the proxy,
// the thread that runs the host collective, queues each copy once the slot
// it needs is free and waits for it. Copies run in their lane's queue
// order (lane 0: out to host, lane 1: in from host), like two device
// streams.
//
// Implementations: CUDA streams (algorithms/cuda/), and the tests'
// HostStageDevice (tests/cpp/host_stage_device.h), whose memory is host
// memory: the CI tests run the staged schedules with it, and the GPU run
// checks the CUDA one against it bit for bit.
#include <cstddef>
#include <cstdint>

#include "common/dtype.h"

namespace smdccl {

class StageDevice {
 public:
  // A queued copy: its lane in the low bit, its number on the lane above.
  using Ticket = uint64_t;
  virtual ~StageDevice() = default;

  // How a copy packs: dt data as `wire` carries it (float32 on a 16-bit
  // wire: cast to it on the way out, widened on the way in; anything else:
  // the bytes themselves); `int8`: float32 as one block-int8 piece
  // (kernels/cpu/quantize.h: quantized on the way out, decoded on the way in).
  struct Unpack {
    DType dt;
    Wire wire = Wire::F32;
    bool int8 = false;
  };
  // One copy. Out: slot = dev[0, count) as `how` says. In: dev[0, count)
  // from the slot, as `how` says.
  struct Copy {
    bool out = true;
    void* slot = nullptr;
    char* dev = nullptr;
    size_t count = 0;
    Unpack how{DType::U8};
  };

  // Queue a copy behind the ones queued on its lane. Never block.
  Ticket toHost(void* slot, const char* src, size_t count, const Unpack& how);
  Ticket fromHost(char* dst, const void* slot, size_t count, const Unpack& how);
  // Whether `t` has run. Never blocks.
  bool done(Ticket t);
  // After a failure: the copies queued still run; nothing waits for them.
  virtual void abandon() {}

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
  // Bytes `count` elements take in a slot.
  static size_t slotBytes(size_t count, const Unpack& how);
  // Whether the device casts or quantizes (its scratch holds the packed piece).
  static bool transforms(const Unpack& how) { return how.int8 || packed(how.dt, how.wire); }

 protected:
  // Queue copy `number` (from 1, per lane, in order) of `lane`.
  virtual void queue(int lane, uint64_t number, const Copy& c) = 0;
  // Whether copy `number` of `lane` has run. Never blocks.
  virtual bool ran(int lane, uint64_t number) = 0;

 private:
  Ticket add(const Copy& c);
  uint64_t queued_[2] = {0, 0};
  uint64_t bytesToHost_ = 0, bytesFromHost_ = 0;
};

}  // namespace smdccl
