#include "common/env.h"

#include <cstdint>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

#include <strings.h>

#include "common/error.h"

namespace smdccl {

const std::vector<EnvVar>& envVars() {
  static const std::vector<EnvVar> vars = {
      {env::kDebug, "WARN",
       "Log level: WARN, INFO, DETAIL (INFO plus a cross-rank check of every collective's full "
       "signature, tensor shapes included) or TRACE (to stderr, prefixed with the rank).",
       EnvVar::Kind::Text, 0, 0, "WARN, INFO, DETAIL, TRACE"},
      {env::kAlgo, "auto",
       "Force algorithms: auto (cheapest by the cost model), a registered name for every "
       "collective it runs (ring, rd, halving, tree, direct, chain, two_level, two_level_rd, "
       "two_level_tree; a collective it does not run gets its kin, e.g. ring -> chain for "
       "broadcast), and/or collective:name pairs, e.g. allreduce:tree,allgather:ring. A two-"
       "level name on one node runs its flat form. ring also keeps compressed reductions on the "
       "ring. docs/algorithms.md lists them."},
      {env::kTopology, "",
       "Override host detection: '2x2' (2 nodes of 2 ranks) or '3,1' (uneven nodes), by global "
       "rank order. Ranks on different virtual nodes talk over TCP."},
      {env::kSocketIfname, "",
       "Network interface for the TCP transport (default: the interface that routes to "
       "MASTER_ADDR)."},
      {env::kShmRingKB, "1024", "Shared-memory ring size per direction per peer pair, in KiB.",
       EnvVar::Kind::Int, 4, 1 << 20},
      {env::kTuneFile, "",
       "Cost-model profile written by `python -m smdccl.tune` (latency and bandwidth per level); "
       "unset: built-in defaults."},
      {env::kPipelineChunkKB, "4096",
       "Chunk size of the pipelined two-level allreduces (and of the halving allreduce), in KiB: "
       "while one chunk crosses the network the next is reduced inside the node.",
       EnvVar::Kind::Int, 1, 1 << 20},
      {env::kTcpBufferKB, "4096",
       "Socket send/receive buffer size for TCP links, in KiB (0: the system's default).",
       EnvVar::Kind::Int, 0, 1 << 20},
      {env::kSpinUs, "-1",
       "Microseconds a waiting thread spins before yielding and then sleeping (-1: chosen from "
       "the number of local ranks and cores).",
       EnvVar::Kind::Int, -1, 10000000},
      {env::kIdleSpinUs, "-1",
       "Microseconds the progress thread polls for new work before sleeping (-1: automatic).",
       EnvVar::Kind::Int, -1, 10000000},
      {env::kCompression, "none",
       "16-bit wire for float32 allreduce / reduce_scatter between nodes: none, fp16 or bf16. "
       "Every addition stays float32; the cast is fused into the send and the receive-and-reduce. "
       "Per group: pg_options={'compression': 'fp16'}.",
       EnvVar::Kind::Text, 0, 0, "none, fp16, bf16"},
      {env::kCompressionIntra, "0",
       "1: compress inside nodes too (shared memory), not only between nodes.",
       EnvVar::Kind::Int, 0, 1},
      {env::kFusionMB, "16",
       "Tensor fusion: async allreduces of up to 1 MiB queued back to back (same dtype and op) "
       "are packed into one buffer of up to this many MiB and reduced as one collective; 0 "
       "turns it off. Ranks agree on how many to fuse, and that their sizes match, with two "
       "tiny extra rounds.",
       EnvVar::Kind::Int, 0, 1024},
      {env::kNanCheck, "0",
       "1: before each collective, check the float inputs for NaN/Inf; the ranks agree on whose "
       "inputs hold any and every rank raises ValueError naming them and the op (the collective "
       "does not run). Costs a scan and one tiny round per collective; turns fusion off.",
       EnvVar::Kind::Int, 0, 1},
      {env::kWarnAfter, "60",
       "Seconds a collective may wait before a warning lists which ranks of the group are in "
       "it, done with it, not arrived yet (with the last collective they reached) or not "
       "answering; 0: never. The group timeout still ends the wait with an error.",
       EnvVar::Kind::Number, 0, 1e9},
      {env::kTrace, "",
       "Chrome-trace timeline (chrome://tracing, Perfetto) of every collective: queued, run, "
       "its checks and the algorithm picked, one JSON file per rank ('{rank}' in the path is "
       "replaced by the global rank, else '.rank<r>' goes before the extension); written when "
       "a group is destroyed and at exit."},
      {env::kCudaIpc, "1",
       "CUDA tensors: 1 moves data between the GPUs (or processes sharing a GPU) of a node "
       "through CUDA IPC buffers; 0 stages everything through pinned host memory and the CPU "
       "transports.",
       EnvVar::Kind::Int, 0, 1},
      {env::kCudaIpcMB, "64",
       "Size of each rank's CUDA IPC buffer, in MiB (allocated on the first CUDA allreduce); "
       "larger messages go through it in pieces of this size.",
       EnvVar::Kind::Int, 1, 1 << 16},
      {env::kCudaOneShotKB, "256",
       "CUDA allreduce inside one node: up to this many KiB every rank reduces all peers' "
       "buffers at once (one-shot, fewer steps); above it each rank reduces a slice and then "
       "gathers the others' (two-shot, less data read).",
       EnvVar::Kind::Int, 0, 1 << 20},
      {env::kCudaStageChunkKB, "4096",
       "CUDA tensors that cross nodes (or every CUDA collective with SMDCCL_CUDA_IPC=0) go "
       "through pinned host memory in chunks of this many KiB, so copies overlap the network.",
       EnvVar::Kind::Int, 64, 1 << 20},
      {env::kCudaStagedRing, "1",
       "CUDA allreduce across nodes: 1 lets the GPU run the staged ring where the host "
       "algorithm would be the ring (the GPU packs pinned slots, cast to the 16-bit wire, and "
       "unpack-reduces them; smdccl's thread ships them); 0 copies each chunk to pinned memory "
       "for the host algorithm. Same results either way.",
       EnvVar::Kind::Int, 0, 1},
      {env::kCudaMaxSms, "0",
       "SMs smdccl's CUDA kernels (reductions, gathers, 16-bit casts) may fill; 0: all. A cap "
       "leaves the rest to the training's own kernels so that collectives overlap with them; "
       "it changes speed, never results. Per process.",
       EnvVar::Kind::Int, 0, 4096},
      {env::kAutoload, "1",
       "0 stops the registration that runs at `import torch` (read by the Python package)."},
  };
  return vars;
}

static const EnvVar& find(const char* name) {
  for (const auto& v : envVars())
    if (std::strcmp(v.name, name) == 0) return v;
  throw std::logic_error(std::string("undeclared smdccl environment variable ") + name);
}

std::string envString(const char* name) {
  const EnvVar& v = find(name);
  const char* s = std::getenv(name);
  return (s && *s) ? std::string(s) : std::string(v.defaultValue);
}

namespace {
std::string rangeText(const EnvVar& v) {
  auto num = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.15g", x);
    return std::string(buf);
  };
  return num(v.min) + " to " + num(v.max);
}

// `value` is one of the ", "-separated `choices`, ignoring case.
bool isOneOf(const char* value, const char* choices) {
  size_t n = std::strlen(value);
  for (const char* c = choices; *c;) {
    const char* end = std::strstr(c, ", ");
    size_t len = end ? static_cast<size_t>(end - c) : std::strlen(c);
    if (len == n && strncasecmp(c, value, n) == 0) return true;
    if (!end) break;
    c = end + 2;
  }
  return false;
}

[[noreturn]] void badValue(const EnvVar& v, const std::string& s, const char* what) {
  throw InvalidArgument(strCat("smdccl: ", v.name, "='", s, "' ", what, ": use ",
                               v.kind == EnvVar::Kind::Int ? "an integer" : "a number", " from ",
                               rangeText(v), " (default ", v.defaultValue, "), or unset it"));
}
}  // namespace

int64_t envInt(const char* name) {
  const EnvVar& v = find(name);
  std::string s = envString(name);
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0') badValue(v, s, "is not an integer");
  if (errno == ERANGE || (v.kind == EnvVar::Kind::Int && (x < v.min || x > v.max)))
    badValue(v, s, "is out of range");
  return x;
}

double envDouble(const char* name) {
  const EnvVar& v = find(name);
  std::string s = envString(name);
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  if (end == s.c_str() || *end != '\0') badValue(v, s, "is not a number");
  if (!std::isfinite(x) || (v.kind == EnvVar::Kind::Number && (x < v.min || x > v.max)))
    badValue(v, s, "is out of range");
  return x;
}

void checkEnvironment() {
  for (const auto& v : envVars()) {
    const char* set = std::getenv(v.name);
    if (!set || !*set) continue;
    if (v.kind == EnvVar::Kind::Int) envInt(v.name);
    else if (v.kind == EnvVar::Kind::Number) envDouble(v.name);
    else if (*v.choices && !isOneOf(set, v.choices))
      throw InvalidArgument(strCat("smdccl: ", v.name, "='", set, "' is not one of: ", v.choices,
                                   " (default ", v.defaultValue, "), or unset it"));
  }
}

}  // namespace smdccl
