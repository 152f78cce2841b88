#pragma once
// Entry points the backend calls, one per collective: each chooses an
// algorithm (the cheapest estimate, measured profile from SMDCCL_TUNE_FILE
// or built-in defaults, among the registered algorithms that can run,
// unless SMDCCL_ALGO forces one) and runs it.
#include <cstddef>
#include <utility>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"

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

// ---- the choice

struct Choice {
  const Algorithm* algo = nullptr;
  bool forced = false;  // SMDCCL_ALGO decided it
};

// The algorithms the model weighs for `coll` (serve it, can run, may be
// picked), with their estimates, in registration order.
std::vector<std::pair<const Algorithm*, double>> estimates(Collective coll, double bytes,
                                                           const Situation& s, const CostModel& m);
// A forced algorithm applies where it can run; elsewhere its fallback does
// (two-level forms fall back to flat on one node), else the model picks.
Choice choose(Collective coll, size_t bytes, const Situation& s, const Tuning& t);

// Which hops of a group carry float32 data on the 16-bit wire.
struct WireHops {
  bool some = false;   // some hop (between nodes, or every hop with intra)
  bool every = false;  // every hop
  bool intra = false;  // inside nodes too (SMDCCL_COMPRESSION_INTRA)
};
// What selection sees of a collective on a group of shape g (the backend's
// groups: situationOf, collectives.h; any shape: plan.h).
Situation situationFor(const GroupShape& g, const WireHops& w, const Tuning& t);
// The model as the wire changes it: the compressed levels move half the bytes.
Tuning forWire(const WireHops& w, const Tuning& t);

// What selection sees of `c` for a collective on dt.
Situation situationOf(const Comm& c, DType dt, const Tuning& t);
// Which of c's hops carry dt data on the 16-bit wire.
WireHops wireHopsOf(const Comm& c, DType dt);

}  // namespace smdccl
