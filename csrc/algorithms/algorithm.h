#pragma once
// An algorithm is one object in the registry (registry.cpp) and one file:
// its name, the collectives it serves, where it can run, its α-β estimate
// and its schedule on the exchange. Selection (collectives.cpp) takes the
// cheapest estimate among those that can run, unless SMDCCL_ALGO names one.
#include <cstddef>
#include <string>
#include <vector>

#include "algorithms/cost_model.h"
#include "common/dtype.h"

namespace smdccl {

struct Comm;
struct Blocks;
struct Tuning;

enum class Collective { Allreduce, ReduceScatter, Allgather, Broadcast, Reduce };
constexpr int kCollectives = 5;
const char* collectiveName(Collective coll);
// "allreduce" -> Allreduce; false for an unknown name.
bool collectiveFromName(const std::string& name, Collective* out);

// What selection knows about a call besides its size.
struct Situation {
  GroupShape g;
  // Float32 data of this reduction crosses some hop as 16 bits (the wire
  // moves half the bytes there), or every hop (then chained sums round more
  // than pairwise ones: see ring.cpp).
  bool someHop16 = false;
  bool everyHop16 = false;
  size_t pipelineChunkBytes = 4 << 20;  // SMDCCL_PIPELINE_CHUNK_KB
  // A reduce-scatter out of place (CollectiveArgs::in): an algorithm that
  // reduces in place pays a copy of the input first.
  bool outOfPlace = false;
  // Float32 SUM over a group compressed to int8 (Comm::int8), with error
  // feedback residuals (Comm::int8Feedback).
  bool int8 = false;
  bool int8Feedback = false;
  // A part of the group (Comm::sub): shaped by the nodes its ranks are on,
  // without the group's levels (no two-level algorithm runs on it).
  bool subgroup = false;
};

// One call's arguments; each collective reads its own.
struct CollectiveArgs {
  char* buf = nullptr;
  size_t count = 0;  // allreduce, reduce: elements of dt
  DType dt = DType::U8;
  RedOp op = RedOp::Sum;
  const Blocks* blocks = nullptr;  // reduce_scatter, allgather: one block per rank
  size_t bytes = 0;                // broadcast
  int root = -1;                   // broadcast, reduce
  // reduce_scatter out of place (both set): the blocks are read from `in`,
  // left as it was unless it is buf itself; buf (laid out alike) is
  // scratch; this rank's reduced block lands in `out`, which may be `in`'s
  // own block but must not overlap the others.
  const char* in = nullptr;
  char* out = nullptr;
};

// A reduce-scatter from `in` (one block of `each` dt elements per rank,
// left as it was) into `out` (this rank's block, reduced with op): the GPU
// paths, whose input and output are separate device buffers.
struct BlockReduction {
  const char* in = nullptr;
  char* out = nullptr;
  size_t each = 0;
  DType dt = DType::U8;
  RedOp op = RedOp::Sum;
};
// An allgather from `in` (eachBytes) into `out` (one block per rank); `in`
// may be `out`'s own block.
struct BlockGather {
  const char* in = nullptr;
  char* out = nullptr;
  size_t eachBytes = 0;
};

class Algorithm {
 public:
  virtual ~Algorithm() = default;
  virtual const char* name() const = 0;
  virtual bool serves(Collective coll) const = 0;
  // Whether its schedule works on this group (power-of-two sizes, several
  // nodes, uniform nodes, ...). Callers ask only for collectives it serves.
  virtual bool canRun(Collective coll, const Situation& s) const { return true; }
  // Whether the model may pick it where it can run; forcing still runs it.
  virtual bool autoCandidate(Collective coll, const Situation& s) const { return true; }
  // Estimated seconds for `bytes` (allreduce, broadcast, reduce: the tensor;
  // reduce_scatter, allgather: all ranks' blocks together).
  virtual double estimate(Collective coll, double bytes, const Situation& s,
                          const CostModel& m) const = 0;
  virtual void run(Collective coll, Comm& comm, const CollectiveArgs& a, const Tuning& t) const = 0;
  // Runs the int8 wire: on an int8 situation the cheapest of these that
  // can run is chosen (the user asked for the bytes it saves), before the
  // model weighs the rest.
  virtual bool int8Wire() const { return false; }
  // Whether run() takes a reduce-scatter out of place (CollectiveArgs::in);
  // for the others reduceScatter() copies the input into buf first.
  virtual bool outOfPlace(Collective coll) const { return false; }
  // Forced where it cannot run: what runs instead (nullptr: the model picks).
  virtual const char* fallback() const { return nullptr; }
  // SMDCCL_ALGO=<name> for the whole group: what runs for a collective it
  // does not serve (nullptr: the model picks).
  virtual const char* kin(Collective coll) const { return nullptr; }
};

// Every algorithm, in registration order (the order ties and logs use).
const std::vector<const Algorithm*>& registeredAlgorithms();
// nullptr for an unknown name.
const Algorithm* findAlgorithm(const std::string& name);
// "ring, rd, ..." for messages.
std::string algorithmNames();

}  // namespace smdccl
