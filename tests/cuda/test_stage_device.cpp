// The GPU's StageDevice against the host stand-in the CI runs: the staged
// ring (algorithms/staged_ring.h) with ranks as threads sharing this GPU,
// each with a CudaStageDevice, must give the host ring's bits, count the
// same bytes across PCIe, and raise the fp16 overflow count where the host
// pack does; in the gated mode (the op queued whole: the stream waits behind
// the gates until the proxy runs) and in the ungated one. Runs only where a
// GPU is (test_kernels.cu exits 77 first otherwise).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/cuda/cuda_stage_device.h"
#include "algorithms/staged_ring.h"
#include "check.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/sm_cap.h"
#include "memory_fabric.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

namespace {

float valueOf(int r, size_t i, float scale) {
  uint64_t h =
      (i + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(r) + 5) * 0xc2b2ae3d27d4eb4full;
  return scale * static_cast<float>(static_cast<int64_t>(h >> 40) % 20001 - 10000) / 997.0f;
}

void cudaOk(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

struct GpuRun {
  size_t n;
  StagePlan plan;
  float scale = 1.0f;
  bool gated = false;  // the device's gated mode: the op queued whole before its proxy runs
};

// Runs the staged ring on the GPU (device buffer, CudaStageDevice) and the
// host ring on the same chunks; returns "" when the bits agree.
std::string compareOnGpu(Comm& c, int r, const GpuRun& run, uint64_t* overflowsSeen) {
  const size_t n = run.n;
  const StagePlan& plan = run.plan;
  const float scale = run.scale;
  std::vector<float> host(n), ref(n), back(n);
  for (size_t i = 0; i < n; ++i) host[i] = ref[i] = valueOf(r, i, scale);
  const size_t chunk = plan.chunkBytes ? plan.chunkBytes / 4 : n;
  for (size_t at = 0; at < n; at += chunk)
    ringAllreduce(c, reinterpret_cast<char*>(ref.data() + at), std::min(chunk, n - at), DType::F32,
                  RedOp::Sum);
  cudaOk(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream;
  cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  void* dev = nullptr;
  void* slots = nullptr;
  cudaOk(cudaMalloc(&dev, n * 4), "cudaMalloc");
  cudaOk(cudaHostAlloc(&slots, plan.hostBytes(), cudaHostAllocPortable), "cudaHostAlloc");
  cudaOk(cudaMemcpy(dev, host.data(), n * 4, cudaMemcpyHostToDevice), "copy in");
  std::string why;
  {
    CudaStageDevice d(nullptr, run.gated);
    if (d.gated() != run.gated) why = "the gated mode is not available on this GPU";
    uint64_t before = tlsFp16Overflows;
    d.begin(stream, static_cast<char*>(slots), plan, c.ctx);
    auto proxy = planStagedRingAllreduce(
        c, d, {.buf = static_cast<char*>(dev), .count = n, .dt = DType::F32, .op = RedOp::Sum},
        static_cast<char*>(slots), plan);
    d.queueEnd();
    // Gated, the stream now holds the whole op, behind gates only the proxy opens.
    if (run.gated && proxy && n >= static_cast<size_t>(c.size()) &&
        cudaStreamQuery(stream) != cudaErrorNotReady)
      why = "the op's stream did not wait for the gated copies";
    if (proxy) proxy->run();
    d.finish();
    cudaOk(cudaStreamSynchronize(stream), "sync");
    *overflowsSeen = tlsFp16Overflows - before;
    cudaOk(cudaMemcpy(back.data(), dev, n * 4, cudaMemcpyDeviceToHost), "copy out");
    if (why.empty() && std::memcmp(back.data(), ref.data(), n * 4) != 0)
      why = "GPU staged ring bits differ from the host ring";
    size_t wireBytes = c.wire == Wire::F32 ? 4 : 2;
    // 2 (p-1)/p of the data each way, give or take an element per block and chunk.
    double expect = 2.0 * (c.size() - 1) / c.size() * n * wireBytes;
    double slack = 2.0 * c.size() * ((n + chunk - 1) / chunk) * wireBytes;
    if (why.empty() && std::fabs(static_cast<double>(d.bytesToHost()) - expect) > slack)
      why = "bytes to host " + std::to_string(d.bytesToHost()) + ", expected about " +
            std::to_string(expect);
  }
  cudaFree(dev);
  cudaFreeHost(slots);
  cudaStreamDestroy(stream);
  return why;
}

}  // namespace

TEST(cuda_staged_ring_has_the_host_rings_bits) {
  struct Shape {
    std::vector<int> nodes;
    Wire wire;
  };
  const Shape shapes[] = {{{1, 1}, Wire::F16}, {{1, 1, 1}, Wire::BF16}, {{1, 1, 1, 1}, Wire::F32}};
  const StagePlan plans[] = {{1u << 20, 4, 4u << 20}, {4096, 2, 0}, {64, 1, 1024}};
  const size_t sizes[] = {1, 1021, 3u << 20};
  std::mutex mu;
  std::vector<std::string> failures;
  for (const Shape& s : shapes) {
    MemoryFabric fabric(s.nodes);
    std::string error = fabric.run(
        [&](int r, Comm& c) {
          c.wire = s.wire;
          int variant = 0;
          for (const StagePlan& plan : plans)
            for (size_t n : sizes) {
              if (plan.slotBytes < 1024 && n > 100000)
                continue;  // a million tiny pieces: slow, not new
              uint64_t overflows = 0;
              const bool gated = variant++ % 2 == 0;
              std::string why = compareOnGpu(
                  c, r, {.n = n, .plan = plan, .scale = 1.0f, .gated = gated}, &overflows);
              if (!why.empty()) why += gated ? " (gated)" : " (ungated)";
              if (!why.empty()) {
                std::lock_guard<std::mutex> lock(mu);
                failures.push_back(std::string(wireName(s.wire)) +
                                   " p=" + std::to_string(c.size()) + " n=" + std::to_string(n) +
                                   " slot " + std::to_string(plan.slotBytes) + ": rank " +
                                   std::to_string(r) + ": " + why);
              }
            }
        },
        120);
    if (!error.empty()) failures.push_back(error);
  }
  for (const auto& f : failures) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  CHECK(failures.empty());
}

TEST(cuda_staged_ring_counts_fp16_overflows) {
  // Values near fp16's limit: the partial sums pass 65504 and the packs
  // turn them into inf, as the host pack would; the count must say so.
  MemoryFabric fabric({1, 1});
  std::vector<uint64_t> seen(2);
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.wire = Wire::F16;
        uint64_t overflows = 0;
        compareOnGpu(c, r,
                     {.n = 4096, .plan = StagePlan{4096, 2, 0}, .scale = 60000.0f, .gated = r == 0},
                     &overflows);
        seen[r] = overflows;
      },
      60);
  CHECK(error.empty());
  CHECK(seen[0] > 0 || seen[1] > 0);
}

TEST(cuda_sm_cap_keeps_results) {
  // One SM or all of them: the same sums, and the same fp16 packing.
  const size_t n = (1u << 20) + 3;
  std::vector<float> a(n), b(n), cpu(n), gpu(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = valueOf(0, i, 1.0f);
    b[i] = valueOf(1, i, 1.0f);
  }
  reduceTo(cpu.data(), a.data(), b.data(), n, {DType::F32, RedOp::Sum});
  void *da = nullptr, *db = nullptr;
  CHECK(cudaMalloc(&da, n * 4) == cudaSuccess && cudaMalloc(&db, n * 4) == cudaSuccess);
  const int saved = cuda::maxSms();
  for (int cap : {1, 0}) {
    cuda::setMaxSms(cap);
    CHECK(cudaMemcpy(da, a.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cudaMemcpy(db, b.data(), n * 4, cudaMemcpyHostToDevice) == cudaSuccess);
    CHECK(cuda::reduce2(da, da, db, {n, DType::F32, RedOp::Sum}, nullptr) == cudaSuccess);
    CHECK(cudaMemcpy(gpu.data(), da, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(gpu.data(), cpu.data(), n * 4) == 0);
  }
  cuda::setMaxSms(saved);
  cudaFree(da);
  cudaFree(db);
}
