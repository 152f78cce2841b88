#pragma once
// The staged rounds (staged_rounds.h) of the collectives that a device
// stages through the host algorithms: which ranges go out to a pinned slot,
// which host collective runs on it, which ranges come back. Device-neutral:
// the GPU paths plan them on the CUDA StageDevice, the CI tests on the host
// stand-in. Each keeps a copy of c (its proxy may run after c is gone); `t`
// must outlive the job.
#include <cstddef>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/staged_rounds.h"

namespace smdccl {

// Rounds in flight, a slot each.
constexpr int kStagedRoundSlots = 4;

// A staged reduction's float32 data crosses PCIe packed to
// c.resultWire(dt): c's 16-bit wire where some hop is compressed (its
// results are rounded to it), else as it is. Packed, the host widens the
// slot to float32, runs the collective a host tensor would get, with its
// float32 sums and wire, and narrows the results (exactly: they are the
// wire's values already) for the trip back. Half the bytes cross PCIe; the
// one difference from a host tensor's results is that this rank's own
// input was rounded to the wire first (within the wire's bound).
//
// In-place allreduce of a (device memory), chunk by chunk: chunk k out
// (packed), the host allreduce of it (the host path's bits for its size),
// back. Slots of a chunk, or of the tensor where it is smaller.
StagedRoundsJob allreduceRounds(const Comm& c, const CollectiveArgs& a, size_t chunkBytes,
                                const Tuning& t);
// Every block of r.in out (packed), the host
// reduce-scatter, this rank's block back to r.out: one round, so that the
// host algorithm (and its bits) is the one the whole message gets.
StagedRoundsJob reduceScatterRounds(const Comm& c, const BlockReduction& r, const Tuning& t);
// The same piece of every rank's block per round (at most `roundBytes` of
// pinned memory per round, 16-byte pieces at least): this rank's piece
// out into its place, the host allgather, every piece back into b.out.
// Nothing is reduced, so the pieces change no bits.
StagedRoundsJob allgatherRounds(const Comm& c, const BlockGather& b, size_t roundBytes,
                                const Tuning& t);

// Broadcast of `bytes` at device address buf from rank `root`, in pieces of
// at most `roundBytes` a round: the root's piece out, the host broadcast,
// the piece back on every other rank (bytes only: no bits change).
struct StagedBroadcast {
  char* buf = nullptr;
  size_t bytes = 0;
  int root = 0;
  size_t roundBytes = 4u << 20;
};
StagedRoundsJob broadcastRounds(const Comm& c, const StagedBroadcast& b, const Tuning& t);

}  // namespace smdccl
