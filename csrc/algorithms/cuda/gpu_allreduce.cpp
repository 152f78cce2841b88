// The IPC allreduce (the paths ipc_one_shot, ipc_two_shot, two_level_ipc:
// algorithms/gpu_paths.h).
//
// The IPC steps are ordered across processes by node barriers, before
// anyone reads what the others wrote and again before anyone overwrites its
// buffer: each rank's host waits for its stream, then meets its node-mates
// (GpuContext::nodeBarrier). Not spinning kernels, which would hold a GPU
// that ranks share (their contexts are time-sliced, not concurrent) while
// the peer they wait for cannot run.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives.h"
#include "algorithms/slices.h"
#include "algorithms/staged_collectives.h"
#include "algorithms/cuda/gpu_collectives.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "common/log.h"

namespace smdccl {

namespace {

struct IpcStep {
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
  // Reduce-scatter: this rank's slice of every buffer, reduced into its own.
  void reduceMySlice(const Slices& s) {
    int me = space.localRank();
    size_t n = s.end[me] - s.begin[me];
    auto in = peers(s.begin[me] * es);
    if (n)
      checkCuda(cuda::reduceMulti(space.buffer(me) + s.begin[me] * es, in.data(), space.localSize(),
                                  {n, dt, op}, g.stream()),
                "two-shot reduce-scatter");
    sync("two-shot reduce-scatter");
  }
  // Allgather: slice q from rank q's buffer into the output.
  void gather(char* dev, const Slices& s) {
    std::vector<size_t> b, e;
    for (size_t q = 0; q < s.begin.size(); ++q) {
      b.push_back(s.begin[q] * es);
      e.push_back(s.end[q] * es);
    }
    std::vector<const void*> in(space.buffers().begin(), space.buffers().end());
    // A tensor aligned unlike the IPC buffers (a view at an odd offset,
    // x[1:]) would send the kernel down its byte-by-byte path: the copy
    // engines take any alignment at full speed, one copy per slice.
    bool misaligned = false;
    for (size_t q = 0; q < b.size(); ++q)
      misaligned |= ((reinterpret_cast<uintptr_t>(dev + b[q]) ^
                      reinterpret_cast<uintptr_t>(static_cast<const char*>(in[q]) + b[q])) &
                     15u) != 0;
    if (misaligned) {
      for (size_t q = 0; q < b.size(); ++q)
        if (e[q] > b[q])
          checkCuda(cudaMemcpyAsync(dev + b[q], static_cast<const char*>(in[q]) + b[q], e[q] - b[q],
                                    cudaMemcpyDeviceToDevice, g.stream()),
                    "two-shot allgather (copies)");
    } else {
      checkCuda(
          cuda::gatherSlices(dev, {in.data(), b.data(), e.data(), space.localSize()}, g.stream()),
          "two-shot allgather");
    }
    sync("two-shot allgather");
  }
};

}  // namespace

// The IPC allreduce: inside the node over the IPC buffers, in pieces of a
// buffer: one-shot where a piece is at most SMDCCL_CUDA_ONESHOT_KB on one
// node, else two-shot; with several nodes each rank's slice of a piece is
// allreduced across nodes (staged) between its reduce-scatter and gather.
void ipcAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  const DType dt = a.dt;
  const RedOp op = a.op;
  const size_t es = elementSize(dt);
  const Hierarchy& h = *c.levels;
  Comm local = c.sub(h.nodes[h.myNode]);
  CudaIpcSpace& space = g.ipc(h, c.ctx.deadline);
  IpcStep step{c, local, g, space, dt, op, es};
  const bool multiNode = h.numNodes() > 1;
  Comm across = multiNode ? c.sub(h.acrossNodes(h.myLocal)) : local;
  size_t chunk = space.bytes() / es;
  for (size_t at = 0; at < a.count; at += chunk) {
    size_t n = std::min(chunk, a.count - at);
    char* d = a.buf + at * es;
    if (!multiNode && n * es <= g.tuning().oneShotBytes) {
      step.oneShot(d, n);
      continue;
    }
    Slices s(n, space.localSize(), es);
    step.stageIn(d, n);
    step.reduceMySlice(s);
    if (multiNode) {  // this rank's slice across nodes
      const int me = space.localRank();
      across.int8Feedback = c.int8Feedback.from(at + s.begin[me]);
      stagedAllreduce(across, g,
                      {.buf = space.buffer(me) + s.begin[me] * es,
                       .count = s.end[me] - s.begin[me],
                       .dt = dt,
                       .op = op},
                      t);
      g.nodeBarrier(c, local, "inter-node allreduce");  // every slice final before the gather
    }
    step.gather(d, s);
  }
}

}  // namespace smdccl
