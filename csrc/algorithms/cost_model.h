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

// Per-message software cost of one more chunk in a pipeline (syscalls,
// bookkeeping): what stops a pipelined scheme from cutting chunks forever.
constexpr double kPerMessageUs = 2.0;

// Chunks a pipelined schedule cuts `bytes` into (at most 64).
size_t pipelineChunks(size_t bytes, size_t chunkBytes);
int floorLog2(int p);
int ceilLog2(int p);

// Cost terms several algorithms' estimates share (each algorithm's file
// composes its own estimate from them).
struct Costs {
  const CostModel& m;
  const GroupShape& g;
  double reduceSeconds(double bytes) const { return bytes / (m.reduceGbps * 1e9); }
  // The level a flat algorithm's slowest hop runs on.
  const LevelCost& bottleneck() const { return g.nodes > 1 ? m.inter : m.intra; }
  // A streaming ring of `steps` steps moving `stepBytes` each through its
  // slowest link, `reduceSteps` of them adding.
  double ring(int steps, double stepBytes, int reduceSteps) const;
  // Recursive doubling over the flat group, whole message every round.
  double rd(double bytes) const;
  // Recursive doubling inside one node of `local` ranks.
  double rdLocal(double bytes, int local) const;
  // A binomial tree moving the whole message down (or up) the group.
  double binomialTree(double bytes) const;
};

}  // namespace smdccl
