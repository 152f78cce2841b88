// Reduce-scatter and allgather of device memory (reduce_scatter_tensor and
// all_gather_into_tensor, what FSDP calls) on the IPC path inside one node
// (algorithms/gpu_paths.h). The IPC steps are ordered across processes by node barriers,
// as in gpu_allreduce.cpp.
#include <algorithm>
#include <vector>

#include "algorithms/cuda/gpu_collectives.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

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

}  // namespace smdccl
