// Allreduce of device memory: CUDA IPC inside a node, pinned host staging
// between nodes (see gpu_collectives.h for when each path is taken).
//
// The IPC steps are ordered across processes by node barriers, before
// anyone reads what the others wrote and again before anyone overwrites its
// buffer. They are queued on the stream (stream memory operations:
// GpuContext::nodeBarrier), so the host queues the collective whole and
// goes on; not spinning kernels, which would hold a GPU that ranks share
// (their contexts are time-sliced, not concurrent) while the peer they wait
// for cannot run. With SMDCCL_CUDA_STREAM_BARRIER=0 the host meets them.
#include <algorithm>
#include <cstdint>

#include "algorithms/algorithm.h"
#include "algorithms/collectives.h"
#include "algorithms/slices.h"
#include "algorithms/staged_ring.h"
#include "algorithms/cuda/gpu_collectives.h"
#include "algorithms/cuda/ipc_steps.h"
#include "algorithms/cuda/staged_schedule.h"
#include "common/log.h"
#include "common/trace.h"

namespace smdccl {

namespace {

// Chunks of the staged pipeline in pinned memory at once: one being copied
// in, one on the network, one being copied out, one spare.
constexpr size_t kStageSlots = 4;

struct IpcStep {
  Comm& c;
  Comm local;
  GpuContext& g;
  CudaIpcSpace& space;
  DType dt;
  RedOp op;
  size_t es;

  // Every node-mate's stream is done with its part: now their buffers may be read (or reused).
  void sync(const char* what) { ipcStepDone(g, c, local, what); }
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

const char* gpuAllreducePath(const Comm& c, const GpuContext& g, size_t bytes) {
  if (!ipcUsable(c, g)) return "staged";
  if (c.levels->numNodes() > 1) return "two-level ipc + staged";
  return bytes <= g.tuning().oneShotBytes ? "ipc one-shot" : "ipc two-shot";
}

namespace {

// Where the host path would run the ring on every staging chunk, the device
// runs it (staged_ring.h): same bits, the 16-bit cast done by the GPU, half
// the bytes over PCIe with a compressed wire, and copies out, network and
// copies in overlapping per piece.
bool stagedRingFits(const Comm& c, size_t count, size_t chunk, DType dt, const Tuning& t) {
  if (!isRingAlgorithm(allreduceAlgorithm(c, std::min(chunk, count), dt, t))) return false;
  size_t tail = count % chunk;
  return count <= chunk || tail == 0 || isRingAlgorithm(allreduceAlgorithm(c, tail, dt, t));
}

}  // namespace

void stagedAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  char* dev = a.buf;
  const size_t count = a.count;
  const DType dt = a.dt;
  const RedOp op = a.op;
  if (count == 0 || c.size() == 1) return;
  const size_t es = elementSize(dt);
  const size_t chunk = std::max<size_t>(1, g.tuning().stageChunkBytes / es);
  if (g.tuning().stagedRing && stagedRingFits(c, count, chunk, dt, t)) {
    runStagedSchedule(g, c.ctx, chunk * es, dt,
                      [&](StageDevice& d, char* slots, const StagePlan& plan) {
                        stagedRingAllreduce(c, d, a, slots, plan);
                      });
    waitForStream(g.stream(), c.ctx, "the staged ring's copies into device memory");
    return;
  }
  const size_t chunks = (count + chunk - 1) / chunk;
  // Pinned memory for a few chunks, reused round-robin, not for the whole
  // tensor: pinning is slow and takes host memory away for good.
  const size_t slots = std::min(chunks, kStageSlots);
  // Nothing may still be copying out of the staging buffer from an earlier op.
  waitForStream(g.stream(), c.ctx, "the previous copy out of the staging buffer");
  char* host = g.staging().reserve(slots * chunk * es);
  auto slot = [&](size_t k) { return host + (k % slots) * chunk * es; };
  auto elements = [&](size_t k) { return std::min(chunk, count - k * chunk); };
  auto copyIn = [&](size_t k) {
    checkCuda(cudaMemcpyAsync(slot(k), dev + k * chunk * es, elements(k) * es,
                              cudaMemcpyDeviceToHost, g.stream()),
              "copy to pinned host memory");
    g.countCopies(elements(k) * es, 0);
    checkCuda(cudaEventRecord(g.event(k % slots), g.stream()), "cudaEventRecord");
  };
  for (size_t k = 0; k < slots; ++k) copyIn(k);
  for (size_t k = 0; k < chunks; ++k) {
    waitForEvent(g.event(k % slots), c.ctx, "copy to pinned host memory");
    allreduce(c, {.buf = slot(k), .count = elements(k), .dt = dt, .op = op}, t);
    checkCuda(cudaMemcpyAsync(dev + k * chunk * es, slot(k), elements(k) * es,
                              cudaMemcpyHostToDevice, g.stream()),
              "copy from pinned host memory");
    g.countCopies(0, elements(k) * es);
    // Queued behind that copy out of the slot, on the same stream.
    if (k + slots < chunks) copyIn(k + slots);
  }
  waitForStream(g.stream(), c.ctx, "copy from pinned host memory");
}

void gpuAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t) {
  char* dev = a.buf;
  const size_t count = a.count;
  const DType dt = a.dt;
  const RedOp op = a.op;
  if (count == 0 || c.size() == 1) return;
  g.agreeOnTuning(c, t);
  size_t es = elementSize(dt);
  const char* path = gpuAllreducePath(c, g, count * es);
  trace::Span span(trace::enabled() ? strCat("cuda allreduce: ", path) : std::string(), "algorithm",
                   *c.ctx.group);
  if (!ipcUsable(c, g)) {
    stagedAllreduce(c, g, a, t);
    return;
  }
  const Hierarchy& h = *c.levels;
  Comm local = c.sub(h.nodes[h.myNode]);
  CudaIpcSpace& space = g.ipc(h, c.ctx.deadline);
  IpcStep step{c, local, g, space, dt, op, es};
  const bool multiNode = h.numNodes() > 1;
  Comm across = multiNode ? c.sub(h.acrossNodes(h.myLocal)) : local;
  size_t chunk = space.bytes() / es;
  for (size_t at = 0; at < count; at += chunk) {
    size_t n = std::min(chunk, count - at);
    char* d = dev + at * es;
    if (!multiNode && n * es <= g.tuning().oneShotBytes) {
      step.oneShot(d, n);
      continue;
    }
    Slices s(n, space.localSize(), es);
    step.stageIn(d, n);
    step.reduceMySlice(s);
    if (multiNode) {
      int me = space.localRank();
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
