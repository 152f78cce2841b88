#pragma once
// Entry points the backend calls: one per collective, algorithm chosen here.
#include "algorithms/comm.h"
#include "algorithms/select.h"

namespace smdccl {

// In place: a.count a.dt elements at a.buf, reduced with a.op.
void allreduce(Comm& c, const CollectiveArgs& a, const Tuning& t);
// The algorithm allreduce() runs for `count` dt elements on c (SMDCCL_ALGO,
// else the model): a staged device path runs its own ring only where this
// is the ring, so that its results have the host path's bits.
const Algorithm* allreduceAlgorithm(const Comm& c, size_t count, DType dt, const Tuning& t);
// The algorithm reduceScatter() runs for `bytes` (all blocks together) of dt
// data on c, with the same purpose.
const Algorithm* reduceScatterAlgorithm(const Comm& c, size_t bytes, DType dt, const Tuning& t);
// a.buf holds the full input (size() blocks, *a.blocks, of a.dt reduced
// with a.op); on return block rank() holds the result. Out of place
// (a.in, a.out: see CollectiveArgs), buf is scratch and a.out the result.
void reduceScatter(Comm& c, const CollectiveArgs& a, const Tuning& t);
// On entry block rank() of buf is filled; on return all blocks are.
void allgather(Comm& c, char* buf, const Blocks& b, const Tuning& t);
void broadcast(Comm& c, char* buf, size_t bytes, int root, const Tuning& t);
// On return a.root's a.buf holds the reduction (a.count a.dt elements,
// a.op); elsewhere a.buf is scratch (its contents are undefined).
void reduce(Comm& c, const CollectiveArgs& a, const Tuning& t);
void barrier(Comm& c);

// What selection sees of `c` for a collective on dt.
Situation situationOf(const Comm& c, DType dt, const Tuning& t);
// Which of c's hops carry dt data on the 16-bit wire.
WireHops wireHopsOf(const Comm& c, DType dt);

}  // namespace smdccl
