#include "algorithms/select.h"

#include "common/env.h"
#include "common/error.h"

namespace smdccl {

Tuning Tuning::fromEnv() {
  Tuning t;
  std::string algo = envString(env::kAlgo);
  if (algo == "ring") {
    t.forced = true;
    t.forcedAlgo = AllreduceAlgo::Ring;
  } else if (algo == "rd" || algo == "recursive_doubling") {
    t.forced = true;
    t.forcedAlgo = AllreduceAlgo::RecursiveDoubling;
  } else if (algo != "auto") {
    throw InvalidArgument("SMDCCL_ALGO='" + algo + "' is not one of: auto, ring, rd");
  }
  t.smallMsgBytes = static_cast<size_t>(envInt(env::kSmallMsgBytes));
  t.bcastTreeBytes = static_cast<size_t>(envInt(env::kBcastTreeBytes));
  return t;
}

AllreduceAlgo pickAllreduce(size_t bytes, int worldSize, const Tuning& t) {
  if (t.forced) return t.forcedAlgo;
  // Below the threshold latency (log2 p rounds) beats bandwidth (2(p-1) steps).
  return (bytes <= t.smallMsgBytes || static_cast<size_t>(worldSize) * 64 > bytes)
             ? AllreduceAlgo::RecursiveDoubling
             : AllreduceAlgo::Ring;
}

bool useTreeBroadcast(size_t bytes, int worldSize, const Tuning& t) {
  (void)worldSize;
  return bytes <= t.bcastTreeBytes;
}

bool useDirectAllgather(size_t totalBytes, int worldSize, const Tuning& t) {
  return worldSize <= 2 || totalBytes <= t.smallMsgBytes;
}

const char* algoName(AllreduceAlgo a) {
  return a == AllreduceAlgo::Ring ? "ring" : "recursive_doubling";
}

}  // namespace smdccl
