// The choice among the CUDA paths (algorithms/gpu_paths.h), a pure function
// of the call's facts: NCCL where the node chose it, smdccl's IPC kernels
// where ranks share a GPU on one node, staged where neither can run.
#include <set>
#include <string>

#include "algorithms/gpu_paths.h"
#include "check.h"

using namespace smdccl;

namespace {

GpuFacts facts(int nodes, int local, bool nccl, Collective coll = Collective::Allreduce,
               size_t bytes = 64u << 20) {
  GpuFacts f;
  f.coll = coll;
  f.bytes = bytes;
  f.nodes = nodes;
  f.localSize = local;
  f.ncclTypes = true;
  f.ncclChosen = nccl;
  return f;
}

std::string pick(const GpuFacts& f) { return chooseGpuPath(f).name(); }

}  // namespace

TEST(gpu_paths_nccl_where_the_node_chose_it) {
  CHECK(pick(facts(1, 4, true)) == "nccl");
  CHECK(pick(facts(1, 4, true, Collective::ReduceScatter)) == "nccl");
  CHECK(pick(facts(1, 4, true, Collective::Allgather)) == "nccl");
  CHECK(pick(facts(2, 2, true)) == "nccl");  // reduce-scatter, staged step, allgather
  CHECK(pick(facts(1, 4, true, Collective::Allreduce, 4096)) == "nccl");
  // Across nodes: NCCL inside each node, the node's share staged between
  // nodes (algorithms/node_then_across.h).
  CHECK(pick(facts(2, 2, true, Collective::ReduceScatter)) == "nccl");
  CHECK(pick(facts(2, 2, true, Collective::Allgather)) == "nccl");
  CHECK(pick(facts(2, 2, true, Collective::Broadcast)) == "nccl");
  CHECK(pick(facts(2, 2, false, Collective::Broadcast)) == "staged");
  // More ranks in a node than the IPC kernels take: NCCL still runs.
  CHECK(pick(facts(1, 32, true)) == "nccl");
}

TEST(gpu_paths_ipc_where_ranks_share_a_gpu) {
  for (size_t bytes : {size_t(4096), size_t(1) << 20, size_t(64) << 20}) {
    CHECK(pick(facts(1, 4, false, Collective::Allreduce, bytes)) == "ipc");
    CHECK(pick(facts(1, 4, false, Collective::ReduceScatter, bytes)) == "ipc");
    CHECK(pick(facts(1, 4, false, Collective::Allgather, bytes)) == "ipc");
  }
  CHECK(pick(facts(1, 4, false, Collective::Broadcast)) == "staged");
  CHECK(pick(facts(1, 32, false)) == "staged");  // past the kernels' 16 inputs
  // Across nodes the whole tensor is staged: the host's two-level
  // algorithms take the node's shared-memory hops and the network.
  for (Collective c : {Collective::Allreduce, Collective::ReduceScatter, Collective::Allgather})
    CHECK(pick(facts(2, 2, false, c)) == "staged");
}

TEST(gpu_paths_staged_where_nothing_else_runs) {
  CHECK(pick(facts(2, 1, true)) == "staged");  // one rank per node
  GpuFacts off = facts(1, 4, true);
  off.ipcOn = false;  // SMDCCL_CUDA_IPC=0 stages everything
  CHECK(pick(off) == "staged");
  GpuFacts uneven = facts(2, 3, true);
  uneven.uniform = false;
  CHECK(pick(uneven) == "staged");
  GpuFacts sub = facts(1, 4, true);
  sub.wholeGroup = false;  // a sub-group of the group
  CHECK(pick(sub) == "staged");
  // NCCL has no bitwise reductions nor bool: on a node that chose NCCL
  // (GPUs of their own, peer access unknown) they are staged; where ranks
  // share a GPU the IPC kernels do them.
  for (int nodes : {1, 2}) {
    GpuFacts bitwise = facts(nodes, 4, true, Collective::Allreduce, 4096);
    bitwise.ncclTypes = false;
    CHECK(!ncclMayRun(bitwise));
    CHECK(pick(bitwise) == "staged");
    bitwise.coll = Collective::ReduceScatter;
    CHECK(pick(bitwise) == "staged");
  }
  GpuFacts shared = facts(1, 4, false, Collective::Allreduce, 4096);
  shared.ncclTypes = false;
  CHECK(pick(shared) == "ipc");
}

TEST(gpu_paths_ask_the_node_only_where_nccl_could_run) {
  CHECK(ncclMayRun(facts(1, 4, false)));
  CHECK(ncclMayRun(facts(2, 2, false)));
  CHECK(ncclMayRun(facts(2, 2, false, Collective::Allgather)));
  CHECK(!ncclMayRun(facts(2, 1, false)));
  // Every rank of a node joins the engine's store round alike: a dtype that
  // this rank's NCCL lacks (bf16 before 2.10, or no NCCL) changes which
  // path runs, not whether the node is asked.
  for (int local : {1, 2, 4}) {
    GpuFacts has = facts(2, local, false), lacks = has;
    lacks.ncclTypes = false;
    CHECK(nodeEngineAsked(has) == nodeEngineAsked(lacks));
    CHECK(nodeEngineAsked(has) == ncclMayRun(has));
    CHECK(!ncclMayRun(lacks));
  }
  std::set<std::string> names;
  for (const GpuPath* p : gpuPaths()) names.insert(p->name());
  CHECK(names.size() == gpuPaths().size());
  // Whatever the facts, some path runs: staged serves every collective.
  const GpuPath& last = *gpuPaths().back();
  CHECK(std::string(last.name()) == "staged");
  for (Collective c : {Collective::Allreduce, Collective::ReduceScatter, Collective::Allgather})
    CHECK(last.serves(c) && last.canRun(facts(1, 1, false, c)));
}

TEST(gpu_paths_only_nccl_on_one_node_needs_no_host_step) {
  // A group of one node of 4 whose node chose NCCL: queued whole.
  Hierarchy oneNode = hierarchyOf(topologyFromSpec({4}, {0, 1, 2, 3}, true), 1);
  GpuFacts f = groupFacts(oneNode, GpuTuning{});
  CHECK(f.nodes == 1 && f.localSize == 4 && f.uniform && f.ipcOn);
  f.ncclTypes = true;
  CHECK(!ncclQueuesWhole(f));  // the node has not chosen NCCL (yet)
  f.ncclChosen = true;
  CHECK(ncclQueuesWhole(f));
  // Across nodes the staged step is the host's; SMDCCL_CUDA_IPC=0 stages all.
  GpuFacts across =
      groupFacts(hierarchyOf(topologyFromSpec({2, 2}, {0, 1, 2, 3}, true), 0), GpuTuning{});
  across.ncclTypes = across.ncclChosen = true;
  CHECK(!ncclQueuesWhole(across));
  GpuTuning off;
  off.ipc = false;
  GpuFacts staged = groupFacts(oneNode, off);
  staged.ncclTypes = staged.ncclChosen = true;
  CHECK(!ncclQueuesWhole(staged));
}

TEST(gpu_paths_reduce_is_nccls_on_one_node_else_the_allreduces_path) {
  CHECK(pick(facts(1, 4, true, Collective::Reduce)) == "nccl");  // ncclReduce
  CHECK(pick(facts(2, 2, true, Collective::Reduce)) == "nccl");  // NCCL's two-level allreduce
  CHECK(pick(facts(1, 4, false, Collective::Reduce, 4096)) == "ipc");
  CHECK(pick(facts(2, 2, false, Collective::Reduce)) == "staged");
  CHECK(pick(facts(2, 1, true, Collective::Reduce)) == "staged");
  // On one node NCCL's reduce moves half what its allreduce does.
  GpuFacts reduce = facts(1, 4, true, Collective::Reduce), allreduce = facts(1, 4, true);
  const GpuPath& nccl = chooseGpuPath(reduce);
  CHECK(nccl.estimate(reduce) < nccl.estimate(allreduce));
}
