// The GPU's StageDevice against the host stand-in the CI runs: the staged
// rounds of the GPU's inter-node allreduce and reduce-scatter
// (staged_collectives.h), packed to a 16-bit wire where the group
// compresses, with ranks as threads sharing this GPU, each with a
// CudaStageDevice reused from op to op, must give the bits the same job
// gives on HostStageDevice (also on the int8 wire),
// count the same bytes across PCIe, and raise the fp16 overflow count where
// the host pack does. Runs only where a GPU is (test_kernels.cu exits 77
// first otherwise).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/cuda/cuda_stage_device.h"
#include "host_stage_device.h"
#include "algorithms/staged_collectives.h"
#include "algorithms/staged_rounds.h"
#include "check.h"
#include "common/error.h"
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
  size_t chunkBytes;
  float scale = 1.0f;
  bool reduceScatter = false;  // reduceScatterRounds (n per block), else allreduceRounds
};

const Tuning kTuning{};

StagedRoundsJob jobFor(Comm& c, const GpuRun& run, char* buf, char* out) {
  if (run.reduceScatter)
    return reduceScatterRounds(
        c, {.in = buf, .out = out, .each = run.n, .dt = DType::F32, .op = RedOp::Sum}, kTuning);
  return allreduceRounds(c, {.buf = buf, .count = run.n, .dt = DType::F32, .op = RedOp::Sum},
                         run.chunkBytes, kTuning);
}

// Runs the job on the GPU (device buffers, the rank's CudaStageDevice `d`,
// reused from op to op as a group's is) and on the host stand-in with the
// same inputs; returns "" when the bits and the PCIe bytes agree.
std::string compareOnGpu(Comm& c, int r, const GpuRun& run, CudaStageDevice& d,
                         uint64_t* overflowsSeen) {
  const size_t in = run.reduceScatter ? run.n * static_cast<size_t>(c.size()) : run.n;
  const size_t outN = run.reduceScatter ? run.n : in;
  std::vector<float> host(in), hostOut(outN, -1.0f), back(outN);
  for (size_t i = 0; i < in; ++i) host[i] = valueOf(r, i, run.scale);
  const std::vector<float> input = host;
  HostStageDevice ref;
  {
    StagedRoundsJob job = jobFor(c, run, reinterpret_cast<char*>(host.data()),
                                 reinterpret_cast<char*>(hostOut.data()));
    std::vector<char> slots(job.hostBytes());
    runStagedRounds(c.ctx, ref, std::move(job), slots.data());
  }
  const std::vector<float>& want = run.reduceScatter ? hostOut : host;
  cudaOk(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t stream;
  cudaOk(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  void* dev = nullptr;
  void* devOut = nullptr;
  void* slots = nullptr;
  cudaOk(cudaMalloc(&dev, in * 4), "cudaMalloc");
  cudaOk(cudaMalloc(&devOut, outN * 4), "cudaMalloc");
  cudaOk(cudaMemcpy(dev, input.data(), in * 4, cudaMemcpyHostToDevice), "copy in");
  std::string why;
  {
    const uint64_t out0 = d.bytesToHost(), in0 = d.bytesFromHost();
    StagedRoundsJob job = jobFor(c, run, static_cast<char*>(dev), static_cast<char*>(devOut));
    cudaOk(cudaHostAlloc(&slots, job.hostBytes(), cudaHostAllocPortable), "cudaHostAlloc");
    uint64_t before = tlsFp16Overflows;
    d.run(stream, static_cast<char*>(slots), c.ctx, std::move(job));
    cudaOk(cudaStreamSynchronize(stream), "sync");
    *overflowsSeen = tlsFp16Overflows - before;
    cudaOk(cudaMemcpy(back.data(), run.reduceScatter ? devOut : dev, outN * 4,
                      cudaMemcpyDeviceToHost),
           "copy out");
    if (std::memcmp(back.data(), want.data(), outN * 4) != 0)
      why = "GPU staged bits differ from the host stand-in's";
    else if (d.bytesToHost() - out0 != ref.bytesToHost() ||
             d.bytesFromHost() - in0 != ref.bytesFromHost())
      why = "PCIe bytes " + std::to_string(d.bytesToHost() - out0) + " / " +
            std::to_string(d.bytesFromHost() - in0) + ", the host stand-in's " +
            std::to_string(ref.bytesToHost()) + " / " + std::to_string(ref.bytesFromHost());
  }
  cudaFree(dev);
  cudaFree(devOut);
  cudaFreeHost(slots);
  cudaStreamDestroy(stream);
  return why;
}

// Every (chunk, size, allreduce / reduce-scatter) case on every rank of
// each group of `nodes`, `setUp` applied to the rank's Comm (its wire), one
// CudaStageDevice per rank for all of them: what failed (empty: nothing).
struct Cases {
  const char* label;
  std::vector<std::vector<int>> nodes;
  std::function<void(Comm&)> setUp;
  std::vector<size_t> chunks, sizes;
};

std::vector<std::string> failuresOf(const Cases& k) {
  std::mutex mu;
  std::vector<std::string> failures;
  for (const std::vector<int>& nodes : k.nodes) {
    MemoryFabric fabric(nodes);
    std::string error = fabric.run(
        [&](int r, Comm& c) {
          k.setUp(c);
          cudaOk(cudaSetDevice(0), "cudaSetDevice");
          CudaStageDevice d;  // one per rank, for every op below
          for (size_t chunk : k.chunks)
            for (size_t n : k.sizes)
              for (bool rs : {false, true}) {
                // A million tiny rounds: slow, not new. A reduce-scatter is
                // one round whatever the chunk.
                if ((chunk < 1024 && n > 100000) || (rs && chunk != k.chunks[0])) continue;
                uint64_t overflows = 0;
                std::string why = compareOnGpu(
                    c, r, {.n = n, .chunkBytes = chunk, .reduceScatter = rs}, d, &overflows);
                if (why.empty()) continue;
                std::lock_guard<std::mutex> lock(mu);
                failures.push_back(strCat(k.label, rs ? " reduce-scatter" : "", " p=", c.size(),
                                          " n=", n, " chunk ", chunk, ": rank ", r, ": ", why));
              }
        },
        120);
    if (!error.empty()) failures.push_back(error);
  }
  for (const auto& f : failures) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  return failures;
}

}  // namespace

TEST(cuda_staged_rounds_have_the_host_stand_ins_bits) {
  const std::vector<size_t> chunks = {4u << 20, 4096, 64}, sizes = {1, 1021, 3u << 20};
  const std::pair<std::vector<int>, Wire> shapes[] = {
      {{1, 1}, Wire::F16}, {{1, 1, 1}, Wire::BF16}, {{2, 2}, Wire::F16}, {{1, 1, 1, 1}, Wire::F32}};
  for (const auto& [nodes, wire] : shapes)
    CHECK(failuresOf({wireName(wire), {nodes}, [w = wire](Comm& c) { c.wire = w; }, chunks, sizes})
              .empty());
}

TEST(cuda_staged_int8_rounds_have_the_host_stand_ins_bits) {
  // compression="int8" across nodes (a rank per node): the GPU quantizes
  // the pieces other ranks own and decodes what comes back, through the
  // device's packing scratch; the host runs the int8 exchange. The same
  // bits and PCIe bytes as on the host stand-in, one device per rank for
  // every op (scratch reused and grown). n = 1: too few values to
  // quantize, float32 staged.
  CHECK(failuresOf({"int8",
                    {{1, 1}, {1, 1, 1}},
                    [](Comm& c) { c.int8 = true; },
                    {4u << 20, 4096},
                    {1, 1021, 3u << 20}})
            .empty());
}

TEST(cuda_staged_rounds_count_fp16_overflows) {
  // Values past fp16's limit: the GPU's pack turns them into inf, as the
  // host pack would; the count must say so.
  MemoryFabric fabric({1, 1});
  std::vector<uint64_t> seen(2);
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.wire = Wire::F16;
        uint64_t overflows = 0;
        cudaOk(cudaSetDevice(0), "cudaSetDevice");
        CudaStageDevice d;
        compareOnGpu(c, r, {.n = 4096, .chunkBytes = 4096, .scale = 80000.0f}, d, &overflows);
        seen[r] = overflows;
      },
      60);
  CHECK(error.empty());
  CHECK(seen[0] > 0 && seen[1] > 0);
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
    const void* in[2] = {da, db};
    CHECK(cuda::reduceMulti(da, in, 2, {n, DType::F32, RedOp::Sum}, nullptr) == cudaSuccess);
    CHECK(cudaMemcpy(gpu.data(), da, n * 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(std::memcmp(gpu.data(), cpu.data(), n * 4) == 0);
  }
  cuda::setMaxSms(saved);
  cudaFree(da);
  cudaFree(db);
}
