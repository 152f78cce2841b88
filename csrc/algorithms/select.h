#pragma once
// Which algorithm runs for a collective of a given size on a given group.
// SMDCCL_ALGO forces the allreduce choice; thresholds come from the env.
#include <cstddef>
#include <string>

namespace smdccl {

enum class AllreduceAlgo { Ring, RecursiveDoubling };

struct Tuning {
  bool forced = false;
  AllreduceAlgo forcedAlgo = AllreduceAlgo::Ring;
  size_t smallMsgBytes = 64 << 10;
  size_t bcastTreeBytes = 64 << 10;

  static Tuning fromEnv();  // throws InvalidArgument for a bad SMDCCL_ALGO
};

AllreduceAlgo pickAllreduce(size_t bytes, int worldSize, const Tuning& t);
bool useTreeBroadcast(size_t bytes, int worldSize, const Tuning& t);
// Allgather / reduce-scatter of this total size: one direct round instead of the ring?
bool useDirectAllgather(size_t totalBytes, int worldSize, const Tuning& t);
const char* algoName(AllreduceAlgo a);

}  // namespace smdccl
