#pragma once
// The α-β cost model behind every algorithm choice: each level (intra-node,
// inter-node) has a latency α per message and a bandwidth β; reductions
// cost γ per byte. Estimates are the bottleneck link's time, since the
// algorithms stream their steps (a flat ring crossing a node boundary moves
// at the speed of the uplink, not of shared memory). Pure functions: the
// unit tests check the choices for known shapes.
#include <cstddef>
#include <string>
#include <vector>

namespace smdccl {

struct LevelCost {
  double alphaUs;  // one message's start-up cost
  double gbps;     // bandwidth in GB/s (1e9 bytes per second)
  double secondsFor(double bytes) const { return alphaUs * 1e-6 + bytes / (gbps * 1e9); }
  double bytesSeconds(double bytes) const { return bytes / (gbps * 1e9); }
};

struct CostModel {
  // Defaults: shared memory on a server; a 10 Gbit/s Ethernet uplink per node.
  LevelCost intra{2.0, 8.0};
  LevelCost inter{40.0, 1.25};
  double reduceGbps = 16.0;  // elementwise reduction, bytes of one operand per second
  std::string source = "built-in defaults";

  // Reads a profile written by `python -m smdccl.tune`: lines "key value",
  // '#' comments; keys intra_alpha_us, intra_gbps, inter_alpha_us, inter_gbps,
  // reduce_gbps. Missing keys keep their defaults. Throws InvalidArgument
  // for an unreadable file, an unknown key or a non-positive number.
  static CostModel fromFile(const std::string& path);
  std::string describe() const;
};

// The group as the model sees it.
struct GroupShape {
  int ranks = 1;     // p
  int nodes = 1;     // n
  int maxLocal = 1;  // L: ranks on the fullest node
  bool uniform = true;
};

enum class Algo {
  Ring,           // flat ring (node-major), reduce-scatter + allgather
  RecursiveDoubling,
  TwoLevelRing,   // intra reduce-scatter -> inter ring per shard -> intra allgather, pipelined
  TwoLevelRd,     // intra recursive doubling -> inter recursive doubling
  Direct,         // every block to every rank in one round (allgather)
  Tree,           // binomial tree (broadcast)
  Chain,          // pipelined chain (broadcast)
  TwoLevelTree,   // tree across nodes, then inside each node (broadcast)
};
const char* algoName(Algo a);

enum class Collective { Allreduce, ReduceScatter, Allgather, Broadcast };
const char* collectiveName(Collective c);

// Algorithms that can run `c` on this shape (two-level ones need >1 node;
// reduce-scatter/allgather's two-level form needs uniform nodes).
std::vector<Algo> candidates(Collective c, const GroupShape& g);
// Estimated seconds for `bytes` (allreduce/broadcast: the tensor;
// reduce-scatter/allgather: the whole buffer of all ranks' blocks).
double estimateSeconds(Collective c, Algo a, double bytes, const GroupShape& g,
                       const CostModel& m, size_t pipelineChunkBytes);
// The candidate with the lowest estimate.
Algo cheapest(Collective c, double bytes, const GroupShape& g, const CostModel& m,
              size_t pipelineChunkBytes);
// Chunks the pipelined two-level allreduce cuts `bytes` into.
size_t pipelineChunks(size_t bytes, size_t chunkBytes);

}  // namespace smdccl
