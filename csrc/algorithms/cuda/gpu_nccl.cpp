// CUDA collectives with NCCL inside the node (GpuContext::intra chose it:
// every rank of the node has a GPU of its own), Horovod's hierarchical
// allreduce: NCCL's reduce-scatter inside the node, each rank's block
// reduced across nodes by the host (the staged rounds: packed to the
// group's 16-bit wire on the GPU where the group compresses), NCCL's
// allgather inside the node. Everything NCCL does is queued on the op's
// stream; the staged step waits for it and the op's stream for the staged
// step, so the order needs no node barrier. The host does not wait for
// NCCL's work: the group's watch (GpuContext::watchNccl) fails the group
// and aborts NCCL if it has not finished by the op's deadline.
#include <algorithm>

#include "algorithms/cuda/gpu_collectives.h"

namespace smdccl {

void ncclAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  const Hierarchy& h = *c.levels;
  NcclNodeComm& nccl = g.nccl(h, c.ctx.deadline);
  if (h.numNodes() == 1) {
    nccl.allReduce({a.buf, a.buf, a.count, a.dt, a.op}, g.stream());
    g.watchNccl(c.ctx);
    return;
  }
  Comm across = c.sub(h.acrossNodes(h.myLocal));
  const size_t es = elementSize(a.dt), local = static_cast<size_t>(h.localSize());
  const size_t each = a.count / local, whole = each * local;
  if (each) {
    // In place, as NCCL lays it out: this rank's block is block myLocal.
    char* mine = a.buf + static_cast<size_t>(h.myLocal) * each * es;
    nccl.reduceScatter({a.buf, mine, each, a.dt, a.op}, g.stream());
    stagedAllreduce(across, g, {.buf = mine, .count = each, .dt = a.dt, .op = a.op}, t);
    nccl.allGather({mine, a.buf, each, a.dt}, g.stream());
  }
  if (whole < a.count) {
    // The last count % localSize elements: reduced inside the node, then
    // across nodes by every local rank alike (a few elements).
    char* tail = a.buf + whole * es;
    const size_t n = a.count - whole;
    nccl.allReduce({tail, tail, n, a.dt, a.op}, g.stream());
    stagedAllreduce(across, g, {.buf = tail, .count = n, .dt = a.dt, .op = a.op}, t);
  }
  g.watchNccl(c.ctx);
}

void ncclReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r) {
  g.nccl(*c.levels, c.ctx.deadline).reduceScatter({r.in, r.out, r.each, r.dt, r.op}, g.stream());
  g.watchNccl(c.ctx);
}

void ncclAllgather(Comm& c, GpuContext& g, const BlockGather& b) {
  g.nccl(*c.levels, c.ctx.deadline).allGather({b.in, b.out, b.eachBytes, DType::U8}, g.stream());
  g.watchNccl(c.ctx);
}

void ncclBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a) {
  const Hierarchy& h = *c.levels;
  const std::vector<int>& node = h.nodes[static_cast<size_t>(h.myNode)];
  const int root = static_cast<int>(std::find(node.begin(), node.end(), a.root) - node.begin());
  g.nccl(h, c.ctx.deadline)
      .broadcast({a.buf, a.buf, a.bytes, DType::U8, RedOp::Sum, root}, g.stream());
  g.watchNccl(c.ctx);
}

}  // namespace smdccl
