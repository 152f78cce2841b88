// The IPC collectives of one node (the path ipc: algorithms/gpu_paths.h):
// allreduce, reduce-scatter, allgather. Each step
// reads every node-mate's buffer in one pass (one-shot): where ranks share
// a GPU, the IPC path's case, all buffers are in the same memory, and a
// two-shot split (reduce a slice, then gather) would add a step and a host
// barrier to save no link's bytes.
//
// The IPC steps are ordered across processes by node barriers, before
// anyone reads what the others wrote and again before anyone overwrites its
// buffer: each rank's host waits for its stream, then meets its node-mates
// (GpuContext::nodeBarrier). Not spinning kernels, which would hold a GPU
// that ranks share (their contexts are time-sliced, not concurrent) while
// the peer they wait for cannot run.
#include <algorithm>
#include <vector>

#include "algorithms/cuda/gpu_collectives.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// One piece's steps over the node's IPC buffers.
struct IpcStep {
  IpcStep(Comm& comm, GpuContext& gpu, DType d, RedOp o)
      : c(comm),
        local(comm.sub(comm.levels->nodes[comm.levels->myNode])),
        g(gpu),
        space(gpu.ipc(*comm.levels, comm.ctx.deadline)),
        dt(d),
        op(o),
        es(elementSize(d)) {}

  Comm& c;
  Comm local;
  GpuContext& g;
  CudaIpcSpace& space;
  DType dt;
  RedOp op;
  size_t es;

  // Every node-mate's stream is done with its part: now their buffers may be read (or reused).
  void sync(const char* what) { g.nodeBarrier(c, local, what); }
  std::vector<const void*> peers(size_t byteOffset) const {
    std::vector<const void*> p;
    for (char* b : space.buffers()) p.push_back(b + byteOffset);
    return p;
  }
  void stageIn(const char* dev, size_t n) {
    if (n)
      checkCuda(cudaMemcpyAsync(space.buffer(space.localRank()), dev, n * es,
                                cudaMemcpyDeviceToDevice, g.stream()),
                "copy into the IPC buffer");
    sync("copy into the IPC buffer");
  }
  void oneShot(char* dev, size_t n) {
    stageIn(dev, n);
    auto in = peers(0);
    checkCuda(cuda::reduceMulti(dev, in.data(), space.localSize(), {n, dt, op}, g.stream()),
              "one-shot reduce");
    sync("one-shot reduce");
  }
};

}  // namespace

void ipcAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a) {
  IpcStep step(c, g, a.dt, a.op);
  const size_t chunk = step.space.bytes() / step.es;
  for (size_t at = 0; at < a.count; at += chunk)
    step.oneShot(a.buf + at * step.es, std::min(chunk, a.count - at));
}

// One node, rank r = local rank r. Per piece of `m` elements of every block:
// each rank copies piece p of all P blocks into its IPC buffer (row q at
// q*m), the node meets, each rank reduces row `me` of every buffer into its
// output in one pass, the node meets again before buffers are reused.
void ipcReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r) {
  IpcStep step(c, g, r.dt, r.op);
  const int P = step.space.localSize(), me = step.space.localRank();
  const size_t es = step.es;
  // Rows start on 16 bytes so the reduce takes its vector path.
  const size_t align = std::max<size_t>(1, 16 / es);
  size_t m = step.space.bytes() / (static_cast<size_t>(P) * es);
  if (m >= align) m = m / align * align;
  m = std::max<size_t>(1, m);
  for (size_t a = 0; a < r.each; a += m) {
    const size_t n = std::min(m, r.each - a);
    for (int q = 0; q < P; ++q)
      checkCuda(cudaMemcpyAsync(step.space.buffer(me) + static_cast<size_t>(q) * m * es,
                                r.in + (static_cast<size_t>(q) * r.each + a) * es, n * es,
                                cudaMemcpyDeviceToDevice, g.stream()),
                "copy into the IPC buffer");
    step.sync("copy into the IPC buffer");
    auto rows = step.peers(static_cast<size_t>(me) * m * es);
    checkCuda(cuda::reduceMulti(r.out + a * es, rows.data(), P, {n, r.dt, r.op}, g.stream()),
              "IPC reduce-scatter");
    step.sync("IPC reduce-scatter");
  }
}

// One node. Per piece: each rank copies its block's piece into its IPC
// buffer, the node meets, each rank copies every peer's piece into place,
// the node meets again before buffers are reused.
void ipcAllgather(Comm& c, GpuContext& g, const BlockGather& b) {
  IpcStep step(c, g, DType::U8, RedOp::Sum);
  const int P = step.space.localSize(), me = step.space.localRank();
  char* mine = b.out + static_cast<size_t>(me) * b.eachBytes;
  if (mine != b.in)
    checkCuda(cudaMemcpyAsync(mine, b.in, b.eachBytes, cudaMemcpyDeviceToDevice, g.stream()),
              "copy of this rank's block");
  const size_t piece = std::max<size_t>(16, step.space.bytes() / 16 * 16);
  for (size_t a = 0; a < b.eachBytes; a += piece) {
    const size_t n = std::min(piece, b.eachBytes - a);
    step.stageIn(b.in + a, n);
    // Default kind: a peer's buffer may be on another GPU of the node.
    for (int q = 0; q < P; ++q)
      if (q != me)
        checkCuda(cudaMemcpyAsync(b.out + static_cast<size_t>(q) * b.eachBytes + a,
                                  step.space.buffer(q), n, cudaMemcpyDefault, g.stream()),
                  "IPC allgather");
    step.sync("IPC allgather");
  }
}

}  // namespace smdccl
