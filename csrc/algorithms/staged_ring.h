#pragma once
// Ring allreduce of device memory staged through pinned host slots, with a
// proxy: the device packs each piece of a ring step into a send slot (the
// 16-bit wire cast done by the device, so half the bytes cross PCIe), the
// thread running the exchange ships the slot as soon as the device has
// filled it and receives into free slots, and the device unpacks, or
// unpack-reduces, each received piece into its memory. Every ring step is
// cut into pieces of at most a slot; with several slots per direction the
// copies out, the network and the copies in of successive pieces overlap.
//
// Bits: the same as the host ring (ringAllreduce) run on each chunk, on the
// same data, wire and group: each hop rounds to the wire, the sums are float32, and the last
// sum of the reduce-scatter is rounded to c.resultWire() so that every rank
// holds the same bits.
#include <cstddef>
#include <memory>

#include "algorithms/comm.h"
#include "algorithms/stage_device.h"

namespace smdccl {

struct StagePlan {
  size_t slotBytes = 4u << 20;  // one slot; a piece is slotBytes of device elements at most
  int slots = 4;                // slots per direction (send and receive)
  // The message is cut into chunks of this many bytes, each one ring over
  // even blocks, all streaming in one exchange (0: one chunk). The host
  // path's staging chunk gives the host path's bits.
  size_t chunkBytes = 0;
  // Host bytes the plan needs: `slots` send and `slots` receive slots.
  size_t hostBytes() const { return 2 * static_cast<size_t>(slots) * slotBytes; }
};

// In-place allreduce of a.count a.dt elements at device address a.buf
// (a.op) over c's ranks. `slots` is host memory of plan.hostBytes() (pinned
// on a GPU). Plans every copy on `device` and returns the proxy that runs
// the op (nullptr: nothing to do; it keeps a copy of c); the device and
// the slots must outlive it.
std::unique_ptr<StagedProxy> planStagedRingAllreduce(Comm& c, StageDevice& device,
                                                     const CollectiveArgs& a, char* slots,
                                                     const StagePlan& plan);
// Plans and runs it: returns when every piece is back in device memory.
void stagedRingAllreduce(Comm& c, StageDevice& device, const CollectiveArgs& a, char* slots,
                         const StagePlan& plan);

// c.size() blocks of `each` dt elements at device address buf (block r:
// rank r's), reduced with op.
struct RingBlocks {
  char* buf = nullptr;
  size_t each = 0;
  DType dt = DType::U8;
  RedOp op = RedOp::Sum;
};
// Reduce-scatter in place, staged like stagedRingAllreduce: on return block
// c.rank() of r.buf holds its reduction over every rank (the other blocks
// hold partial sums). The bits of the host ring reduce-scatter
// (ringReduceScatter) over the same blocks. Each block is cut alike into
// chunks, plan.chunkBytes per chunk over all blocks.
std::unique_ptr<StagedProxy> planStagedRingReduceScatter(Comm& c, StageDevice& device,
                                                         const RingBlocks& r, char* slots,
                                                         const StagePlan& plan);
void stagedRingReduceScatter(Comm& c, StageDevice& device, const RingBlocks& r, char* slots,
                             const StagePlan& plan);

}  // namespace smdccl
