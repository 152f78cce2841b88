#pragma once
// What a group is made with: its place among the ranks, its name and
// members, its timeout and its wire settings.
#include <chrono>
#include <string>
#include <vector>

#include "common/dtype.h"

namespace smdccl {

struct BackendConfig {
  int rank = 0;
  int size = 1;
  std::string groupName;
  std::vector<int> globalRanks;  // of the group's members, by group rank
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string masterAddr;  // interface hint
  int worldSize = 0;       // of the default group (to validate SMDCCL_TOPOLOGY)
  // Float32 allreduce / reduce-scatter data between nodes as 16 bits
  // (SMDCCL_COMPRESSION, or pg_options); wireIntra: inside nodes too.
  Wire wire = Wire::F32;
  bool wireIntra = false;
  // compression="int8": float32 SUM allreduce / reduce_scatter between nodes as block int8
  // (algorithms/two_level_int8.cpp); wire stays F32.
  bool int8 = false;
};

}  // namespace smdccl
