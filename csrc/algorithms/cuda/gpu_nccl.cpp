// CUDA collectives with NCCL inside the node (gpu_collectives.h): Horovod's
// hierarchical allreduce across nodes. Everything NCCL does is queued on the
// op's stream; the staged steps wait for it and the op's stream for them,
// so the order needs no node barrier. The host does not wait for NCCL's
// work: each NCCL step is watched as soon as it is queued
// (GpuContext::watchNccl), so a node-mate's failure fails the group early,
// naming NCCL, not a staged step's wait.

#include "algorithms/cuda/gpu_collectives.h"
#include "algorithms/node_then_across.h"
#include "transport/cuda/cuda_check.h"

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
    g.watchNccl(c.ctx);
    // The int8 error feedback's residuals of this block (and below, of the tail).
    across.int8Feedback = c.int8Feedback.from(static_cast<size_t>(h.myLocal) * each);
    stagedAllreduce(across, g, {.buf = mine, .count = each, .dt = a.dt, .op = a.op}, t);
    nccl.allGather({mine, a.buf, each, a.dt}, g.stream());
  }
  if (whole < a.count) {
    // The last count % localSize elements: reduced inside the node, then
    // across nodes by every local rank alike (a few elements).
    char* tail = a.buf + whole * es;
    const size_t n = a.count - whole;
    nccl.allReduce({tail, tail, n, a.dt, a.op}, g.stream());
    g.watchNccl(c.ctx);
    across.int8Feedback = c.int8Feedback.from(whole);
    stagedAllreduce(across, g, {.buf = tail, .count = n, .dt = a.dt, .op = a.op}, t);
  }
  g.watchNccl(c.ctx);
}

namespace {

// The two-level schedules' steps (algorithms/node_then_across.h): NCCL over
// the node and device copies on the op's stream, the staged steps across nodes.
class NcclSteps final : public NodeThenAcrossSteps {
 public:
  NcclSteps(Comm& c, GpuContext& g, const Tuning& t)
      : ctx_(c.ctx), g_(g), t_(t), nccl_(g.nccl(*c.levels, c.ctx.deadline)) {}
  char* scratch(size_t bytes) override { return g_.scratch(bytes); }
  void copy(char* dst, const char* src, size_t bytes) override {
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_.stream()));
  }
  void nodeReduceScatter(const BlockReduction& r) override {
    nccl_.reduceScatter({r.in, r.out, r.each, r.dt, r.op}, g_.stream());
    g_.watchNccl(ctx_);
  }
  void nodeAllgather(const BlockGather& b) override {
    nccl_.allGather({b.in, b.out, b.eachBytes, DType::U8}, g_.stream());
    g_.watchNccl(ctx_);
  }
  void nodeBroadcast(const CollectiveArgs& a) override {
    nccl_.broadcast({a.buf, a.buf, a.bytes, DType::U8, RedOp::Sum, a.root}, g_.stream());
    g_.watchNccl(ctx_);
  }
  void acrossReduceScatter(Comm& across, const BlockReduction& r) override {
    stagedReduceScatter(across, g_, r, t_);
  }
  void acrossAllgather(Comm& across, const BlockGather& b) override {
    stagedAllgather(across, g_, b, t_);
  }
  void acrossBroadcast(Comm& across, const CollectiveArgs& a) override {
    stagedBroadcast(across, g_, a, t_);
  }

 private:
  const OpContext& ctx_;
  GpuContext& g_;
  const Tuning& t_;
  NcclNodeComm& nccl_;
};

}  // namespace

void ncclReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t) {
  NcclSteps steps(c, g, t);
  if (c.levels->numNodes() == 1) steps.nodeReduceScatter(r);
  else nodeThenAcrossReduceScatter(c, steps, r);
}

void ncclAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t) {
  NcclSteps steps(c, g, t);
  if (c.levels->numNodes() == 1) steps.nodeAllgather(b);
  else acrossThenNodeAllgather(c, steps, b);
}

void ncclReduce(Comm& c, GpuContext& g, const CollectiveArgs& a) {
  const Hierarchy& h = *c.levels;
  const int root = h.placeOf(a.root).local;
  g.nccl(h, c.ctx.deadline).reduce({a.buf, a.buf, a.count, a.dt, a.op, root}, g.stream());
  g.watchNccl(c.ctx);
}

void ncclBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  NcclSteps steps(c, g, t);
  acrossThenNodeBroadcast(c, steps, a);
}

}  // namespace smdccl
