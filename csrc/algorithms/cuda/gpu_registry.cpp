// The entry points of gpu_collectives.h: the facts of this call
// (algorithms/gpu_paths.h), the path the choice names, and what that path runs.
#include <cstring>

#include "algorithms/cuda/gpu_collectives.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "algorithms/gpu_paths.h"
#include "algorithms/staged_collectives.h"
#include "common/trace.h"

namespace smdccl {

static_assert(GpuFacts::kMaxIpcRanks == cuda::kMaxReduceInputs,
              "the IPC paths' node size is the reduce kernel's input limit");

namespace {

// The facts of a collective over c; the nodes' engine is asked (a store
// round among the group's ranks, at the first call) where the group's
// shape lets an engine run inside the node (nodeEngineAsked).
GpuFacts factsOf(const Comm& c, GpuContext& g, const GpuFacts& call, const Tuning& t) {
  const Hierarchy& h = *c.levels;
  GpuFacts f = groupFacts(h, g.tuning());
  f.coll = call.coll;
  f.dt = call.dt;
  f.op = call.op;
  f.bytes = call.bytes;
  f.wholeGroup = c.members.empty();
  int unused = 0;
  f.ncclTypes = NcclLibrary::dataType(f.dt, &unused) && NcclLibrary::redOp(f.op, &unused);
  f.ncclChosen = nodeEngineAsked(f) && g.intra(h, c.ctx.deadline).engine == IntraEngine::Nccl;
  f.packWire = f.nodes > 1 ? c.sub(h.acrossNodes(h.myLocal)).resultWire(f.dt) : Wire::F32;
  f.model = t.model;
  return f;
}

// The path chosen for a collective over c, and its span in a trace
// (SMDCCL_TRACE): "cuda allreduce: nccl".
struct Chosen {
  const GpuPath& path;
  trace::Span span;
  bool is(const char* name) const { return std::strcmp(path.name(), name) == 0; }
};

Chosen choose(Comm& c, GpuContext& g, const GpuFacts& call, const Tuning& t) {
  g.agreeOnTuning(c, t);
  const GpuPath& p = chooseGpuPath(factsOf(c, g, call, t));
  return {p,
          trace::Span(trace::enabled() ? strCat("cuda ", collectiveName(call.coll), ": ", p.name())
                                       : std::string(),
                      "algorithm", *c.ctx.group)};
}

// A one-rank group's reduce-scatter or allgather: the input is the output.
void copyOnDevice(GpuContext& g, char* dst, const char* src, size_t bytes) {
  if (dst != src)
    checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream()),
              "copy to the output");
}

// An allreduce, or a reduce (NCCL's on one node where NCCL runs there,
// else the allreduce).
void allreduceOrReduce(Collective coll, Comm& c, GpuContext& g, const CollectiveArgs& a,
                       const Tuning& t) {
  if (a.count == 0 || c.size() == 1) return;
  const Chosen path =
      choose(c, g, {.coll = coll, .dt = a.dt, .op = a.op, .bytes = a.count * elementSize(a.dt)}, t);
  if (path.is("nccl") && coll == Collective::Reduce && c.levels->numNodes() == 1)
    ncclReduce(c, g, a);
  else if (path.is("nccl")) ncclAllreduce(c, g, a, t);
  else if (path.is("staged")) stagedAllreduce(c, g, a, t);
  else ipcAllreduce(c, g, a);
}

}  // namespace

void gpuAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  allreduceOrReduce(Collective::Allreduce, c, g, a, t);
}

void gpuReduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  allreduceOrReduce(Collective::Reduce, c, g, a, t);
}

void gpuReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t) {
  if (r.each == 0) return;
  const size_t blockBytes = r.each * elementSize(r.dt);
  if (c.size() == 1) return copyOnDevice(g, r.out, r.in, blockBytes);
  const Chosen path = choose(c, g,
                             {.coll = Collective::ReduceScatter,
                              .dt = r.dt,
                              .op = r.op,
                              .bytes = blockBytes * static_cast<size_t>(c.size())},
                             t);
  if (path.is("nccl")) ncclReduceScatter(c, g, r, t);
  else if (path.is("ipc")) ipcReduceScatter(c, g, r);
  else stagedReduceScatter(c, g, r, t);
}

void gpuAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t) {
  if (b.eachBytes == 0) return;
  if (c.size() == 1) return copyOnDevice(g, b.out, b.in, b.eachBytes);
  const Chosen path = choose(c, g,
                             {.coll = Collective::Allgather,
                              .dt = DType::U8,
                              .bytes = b.eachBytes * static_cast<size_t>(c.size())},
                             t);
  if (path.is("nccl")) ncclAllgather(c, g, b, t);
  else if (path.is("ipc")) ipcAllgather(c, g, b);
  else stagedAllgather(c, g, b, t);
}

void gpuBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  if (a.bytes == 0 || c.size() == 1) return;
  const Chosen path =
      choose(c, g, {.coll = Collective::Broadcast, .dt = DType::U8, .bytes = a.bytes}, t);
  if (path.is("nccl")) ncclBroadcast(c, g, a, t);
  else stagedBroadcast(c, g, a, t);
}

}  // namespace smdccl
