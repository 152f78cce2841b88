#pragma once
// A collective on device memory that runs on the host, staged through
// pinned slots in rounds: each round copies device ranges out into its slot,
// runs a host step on the slot (a host allreduce of one chunk, a
// reduce-scatter, an allgather), then copies ranges of the slot back. Round
// k + slots reuses round k's slot, so its copies out are queued once round
// k's copies back have run. With several slots, round k+1's copy out and
// round k-1's copy back overlap round k's host step.
//
// Packed rounds (a 16-bit wire): the device casts float32 ranges to the
// wire's 16 bits on the way out and widens them on the way back, so only
// half the bytes cross PCIe; the host step gets the packed data (see
// staged_collectives.h for what it does with it).
#include <cstddef>
#include <functional>
#include <vector>

#include "common/op_context.h"
#include "algorithms/stage_device.h"

namespace smdccl {

// `bytes` at device address `dev` and at `slotOffset` in the round's slot
// (packed: the range takes half as many bytes there).
struct StagedRange {
  char* dev = nullptr;
  size_t slotOffset = 0;
  size_t bytes = 0;
  // float32 quantized to one block-int8 piece in the slot (int8Bytes of
  // its values there), decoded on the way back; the job's wire is not applied.
  bool int8 = false;
};

struct StagedRound {
  std::vector<StagedRange> out;          // device -> slot, before the host step
  std::function<void(char* slot)> host;  // on the slot, once every copy out has run
  std::vector<StagedRange> in;           // slot -> device, after it
};

struct StagedRoundsJob {
  std::vector<StagedRound> rounds;
  size_t slotBytes = 0;  // one slot: at least every range's end
  int slots = 1;         // slots in turn (rounds in flight)
  // What the ranges hold, and the wire they cross PCIe as: float32 on a
  // 16-bit wire is packed (StageDevice::packed); anything else is copied as is.
  DType dt = DType::U8;
  Wire wire = Wire::F32;
  // Whether some range is quantized (the device then needs its scratch).
  bool hasInt8() const;
  // Host bytes the job needs.
  size_t hostBytes() const { return static_cast<size_t>(slots) * slotBytes; }
};

// Checks `job`'s ranges against its slots, then runs it on `device`:
// queues the copies as their slots free up, runs the host steps, and
// returns once every copy has run; on a failure the device abandon()s its
// copies. ctx: the op's deadline, cancel flag and name for its waits (a
// wait past the deadline, or after an abort, throws a CommError naming
// what it waited for). `slots`: job.hostBytes() of host memory (pinned on
// a GPU).
void runStagedRounds(const OpContext& ctx, StageDevice& device, StagedRoundsJob job, char* slots);

}  // namespace smdccl
