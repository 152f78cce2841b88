// Reduce-scatter and allgather of device memory (reduce_scatter_tensor and
// all_gather_into_tensor, what FSDP calls): NCCL or CUDA IPC inside one
// node, pinned host staging otherwise. The IPC steps are ordered across
// processes by node barriers, as in gpu_allreduce.cpp (ipc_steps.h).
#include <algorithm>
#include <vector>

#include "algorithms/cuda/gpu_collectives.h"
#include "algorithms/cuda/ipc_steps.h"
#include "algorithms/cuda/staged_schedule.h"
#include "algorithms/staged_collectives.h"
#include "common/trace.h"

namespace smdccl {

namespace {

// Inter-node reduce-scatter / allgather of CUDA tensors is staged: the
// two-level split of allreduce (IPC slice, then across nodes) would need
// blocks regrouped by local rank, which is not written yet.
bool oneNodeIpc(const Comm& c, const GpuContext& g) {
  return ipcUsable(c, g) && c.levels->numNodes() == 1;
}

// Queues a copy inside device memory on the context's stream (the op's
// end, recorded behind it, is what the caller waits for).
void queueDeviceCopy(GpuContext& g, char* dst, const char* src, size_t bytes, const char* what) {
  if (bytes)
    checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g.stream()), what);
}

// Staged rounds of a host collective (staged_collectives.h) on the GPU.
void stagedRounds(Comm& c, GpuContext& g, StagedRoundsJob job) {
  const bool packs = StageDevice::packed(job.dt, job.wire);
  StagedOnGpu staged(g, c.ctx,
                     {.layout = {.slotBytes = job.slotBytes, .slots = job.slots}, .scratch = packs});
  StageDevice& d = staged.device();
  staged.run(planStagedRounds(c.ctx, d, std::move(job), staged.slots()));
  staged.finish();
}

// The whole input out (packed to c's 16-bit wire where c compresses), the
// host reduce-scatter, this rank's block back.
void stagedReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t) {
  stagedRounds(c, g, reduceScatterRounds(c, r, t));
}

void stagedAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t) {
  // Pieces of SMDCCL_CUDA_STAGE_CHUNK_KB a round: copies out, the network
  // and copies back of successive rounds overlap.
  stagedRounds(c, g, allgatherRounds(c, b, g.tuning().stageChunkBytes, t));
}

// One node, rank r = local rank r. Per piece of `m` elements of every block:
// each rank copies piece p of all P blocks into its IPC buffer (row q at
// q*m), the node meets, each rank reduces row `me` of every buffer into its
// output in one pass, the node meets again before buffers are reused.
void ipcReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r) {
  const char* in = r.in;
  char* out = r.out;
  const size_t each = r.each;
  const DType dt = r.dt;
  const RedOp op = r.op;
  const Hierarchy& h = *c.levels;
  Comm local = c.sub(h.nodes[h.myNode]);
  CudaIpcSpace& space = g.ipc(h, c.ctx.deadline);
  const int P = space.localSize(), me = space.localRank();
  const size_t es = elementSize(dt);
  // Rows start on 16 bytes so the reduce takes its vector path.
  const size_t align = std::max<size_t>(1, 16 / es);
  size_t m = space.bytes() / (static_cast<size_t>(P) * es);
  if (m >= align) m = m / align * align;
  m = std::max<size_t>(1, m);
  for (size_t a = 0; a < each; a += m) {
    const size_t n = std::min(m, each - a);
    for (int q = 0; q < P; ++q)
      checkCuda(cudaMemcpyAsync(space.buffer(me) + static_cast<size_t>(q) * m * es,
                                in + (static_cast<size_t>(q) * each + a) * es, n * es,
                                cudaMemcpyDeviceToDevice, g.stream()),
                "copy into the IPC buffer");
    g.nodeBarrier(c, local, "copy into the IPC buffer");
    std::vector<const void*> rows;
    for (int q = 0; q < P; ++q) rows.push_back(space.buffer(q) + static_cast<size_t>(me) * m * es);
    checkCuda(cuda::reduceMulti(out + a * es, rows.data(), P, {n, dt, op}, g.stream()),
              "IPC reduce-scatter");
    g.nodeBarrier(c, local, "IPC reduce-scatter");
  }
}

// One node. Per piece: each rank copies its block's piece into its IPC
// buffer, the node meets, each rank copies every peer's piece into place,
// the node meets again before buffers are reused.
void ipcAllgather(Comm& c, GpuContext& g, const BlockGather& b) {
  const char* in = b.in;
  char* out = b.out;
  const size_t eachBytes = b.eachBytes;
  const Hierarchy& h = *c.levels;
  Comm local = c.sub(h.nodes[h.myNode]);
  CudaIpcSpace& space = g.ipc(h, c.ctx.deadline);
  const int P = space.localSize(), me = space.localRank();
  char* mine = out + static_cast<size_t>(me) * eachBytes;
  if (mine != in)
    checkCuda(cudaMemcpyAsync(mine, in, eachBytes, cudaMemcpyDeviceToDevice, g.stream()),
              "copy of this rank's block");
  const size_t piece = std::max<size_t>(16, space.bytes() / 16 * 16);
  for (size_t a = 0; a < eachBytes; a += piece) {
    const size_t n = std::min(piece, eachBytes - a);
    checkCuda(cudaMemcpyAsync(space.buffer(me), in + a, n, cudaMemcpyDeviceToDevice, g.stream()),
              "copy into the IPC buffer");
    g.nodeBarrier(c, local, "copy into the IPC buffer");
    // Default kind: a peer's buffer may be on another GPU of the node.
    for (int q = 0; q < P; ++q)
      if (q != me)
        checkCuda(cudaMemcpyAsync(out + static_cast<size_t>(q) * eachBytes + a, space.buffer(q), n,
                                  cudaMemcpyDefault, g.stream()),
                  "IPC allgather");
    g.nodeBarrier(c, local, "IPC allgather");
  }
}

}  // namespace

// NCCL inside one node (gpu_nccl.cpp); across nodes these two stage.
bool oneNodeNccl(const Comm& c, GpuContext& g, DType dt, RedOp op) {
  return c.levels && c.levels->numNodes() == 1 && ncclIntraUsable(c, g, dt, op);
}

const char* gpuScatterGatherPath(const Comm& c, GpuContext& g, DType dt, RedOp op) {
  if (oneNodeNccl(c, g, dt, op)) return "nccl";
  return oneNodeIpc(c, g) ? "ipc" : "staged";
}

void gpuReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t) {
  const char* in = r.in;
  char* out = r.out;
  const size_t each = r.each;
  const DType dt = r.dt;
  if (each == 0) return;
  if (c.size() == 1) {
    if (out != in) queueDeviceCopy(g, out, in, each * elementSize(dt), "copy to the output");
    return;
  }
  g.agreeOnTuning(c, t);
  trace::Span span(trace::enabled()
                       ? strCat("cuda reduce_scatter: ", gpuScatterGatherPath(c, g, dt, r.op))
                       : std::string(),
                   "algorithm", *c.ctx.group);
  if (oneNodeNccl(c, g, dt, r.op)) ncclReduceScatter(c, g, r);
  else if (oneNodeIpc(c, g)) ipcReduceScatter(c, g, r);
  else stagedReduceScatter(c, g, r, t);
}

void gpuAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t) {
  const char* in = b.in;
  char* out = b.out;
  const size_t eachBytes = b.eachBytes;
  if (eachBytes == 0) return;
  if (c.size() == 1) {
    if (out != in) queueDeviceCopy(g, out, in, eachBytes, "copy to the output");
    return;
  }
  g.agreeOnTuning(c, t);
  trace::Span span(trace::enabled()
                       ? strCat("cuda allgather: ", gpuScatterGatherPath(c, g, DType::U8, RedOp::Sum))
                       : std::string(),
                   "algorithm", *c.ctx.group);
  if (oneNodeNccl(c, g, DType::U8, RedOp::Sum)) ncclAllgather(c, g, b);
  else if (oneNodeIpc(c, g)) ipcAllgather(c, g, b);
  else stagedAllgather(c, g, b, t);
}

}  // namespace smdccl
