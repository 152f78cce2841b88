// Bandwidth of the smdccl CUDA kernels against a device-to-device copy
// measured in the same run.
//
//   smdccl_cuda_kernel_bench [--quick] [--json PATH]
//
// One JSON object per line on stdout, then {"summary": ...} with the lowest
// pct_of_copy of the reduce kernels (the target on H100: >= 85). Bytes
// counted: copy 2x (read + write), reduce2 3x, reduceMulti (k+1)x, pack
// and unpack 4+2 bytes per element. Median of 20 timed iterations
// (5 with --quick, which also runs 64 MiB only) after a warm-up.
// Exits 77 with "no CUDA device" when there is no GPU.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kernels/cuda/kernels.h"

using smdccl::DType;
using smdccl::RedOp;
using smdccl::Wire;
namespace gpu = smdccl::cuda;

namespace {

void die(const char* what, cudaError_t e) {
  std::fprintf(stderr, "kernel_bench: %s: %s\n", what, cudaGetErrorString(e));
  std::exit(1);
}
#define CUDA_OK(expr)                      \
  do {                                     \
    cudaError_t e_ = (expr);               \
    if (e_ != cudaSuccess) die(#expr, e_); \
  } while (0)

const char* dtypeStr(DType t) {
  switch (t) {
    case DType::F32: return "float32";
    case DType::F64: return "float64";
    case DType::F16: return "float16";
    case DType::BF16: return "bfloat16";
    case DType::I32: return "int32";
    default: return "other";
  }
}

size_t elemSize(DType t) {
  switch (t) {
    case DType::F64: return 8;
    case DType::F16:
    case DType::BF16: return 2;
    default: return 4;
  }
}

struct Timer {
  cudaStream_t stream;
  int iters;
  std::vector<cudaEvent_t> ev;
  Timer(cudaStream_t s, int n) : stream(s), iters(n), ev(2 * n) {
    for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
  }
  ~Timer() {
    for (auto& e : ev) cudaEventDestroy(e);
  }
  // Median milliseconds of one call of fn (which enqueues on `stream`).
  double median(const std::function<cudaError_t()>& fn) {
    for (int w = 0; w < 3; ++w) CUDA_OK(fn());
    CUDA_OK(cudaStreamSynchronize(stream));
    for (int i = 0; i < iters; ++i) {
      CUDA_OK(cudaEventRecord(ev[2 * i], stream));
      CUDA_OK(fn());
      CUDA_OK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<double> ms(iters);
    for (int i = 0; i < iters; ++i) {
      float t = 0;
      CUDA_OK(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
      ms[i] = t;
    }
    std::sort(ms.begin(), ms.end());
    return iters % 2 ? ms[iters / 2] : 0.5 * (ms[iters / 2 - 1] + ms[iters / 2]);
  }
};

std::vector<std::string> gRecords;

void emit(const std::string& json) {
  std::printf("%s\n", json.c_str());
  std::fflush(stdout);
  gRecords.push_back(json);
}

struct Worst {
  double pct = 1e30;
  std::string what;
};

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  const char* jsonPath = nullptr;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      jsonPath = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--quick] [--json PATH]\n", argv[0]);
      return 2;
    }
  }
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev <= 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  CUDA_OK(cudaSetDevice(0));

  const int iters = quick ? 5 : 20;
  std::vector<size_t> sizes = {size_t(64) << 20};
  if (!quick) sizes.push_back(size_t(256) << 20);
  constexpr int kMaxK = 8;

  cudaStream_t stream;
  CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  Timer timer(stream, iters);
  Worst worstReduce, worstWire;
  double firstCopy = 0;

  for (size_t bytes : sizes) {
    std::vector<void*> in(kMaxK);
    for (auto& p : in) {
      CUDA_OK(cudaMalloc(&p, bytes));
      CUDA_OK(cudaMemset(p, 0x3c, bytes));  // finite values in every type
    }
    void* out = nullptr;
    CUDA_OK(cudaMalloc(&out, bytes));
    CUDA_OK(cudaMemset(out, 0x3c, bytes));
    unsigned long long* overflows = nullptr;
    CUDA_OK(cudaMalloc(&overflows, sizeof(unsigned long long)));
    CUDA_OK(cudaMemset(overflows, 0, sizeof(unsigned long long)));
    CUDA_OK(cudaDeviceSynchronize());

    double copyMs = timer.median(
        [&] { return cudaMemcpyAsync(out, in[0], bytes, cudaMemcpyDeviceToDevice, stream); });
    const double copyGbps = 2.0 * bytes / (copyMs * 1e6);
    if (firstCopy == 0) firstCopy = copyGbps;
    char buf[512];
    std::snprintf(buf, sizeof buf,
                  "{\"kernel\":\"memcpy_d2d\",\"bytes_per_buffer\":%zu,\"bytes_moved\":%.0f,"
                  "\"median_ms\":%.4f,\"gbps\":%.1f}",
                  bytes, 2.0 * bytes, copyMs, copyGbps);
    emit(buf);

    auto record = [&](const char* kernel, const char* dtype, const char* op, int k, double moved,
                      double ms, Worst& worst) {
      double gbps = moved / (ms * 1e6);
      double pct = 100.0 * gbps / copyGbps;
      char kbuf[32] = "";
      if (k > 0) std::snprintf(kbuf, sizeof kbuf, ",\"k\":%d", k);
      char line[512];
      std::snprintf(line, sizeof line,
                    "{\"kernel\":\"%s\",\"dtype\":\"%s\",\"op\":\"%s\"%s,\"bytes_per_buffer\":%zu,"
                    "\"bytes_moved\":%.0f,\"median_ms\":%.4f,\"gbps\":%.1f,\"copy_gbps\":%.1f,"
                    "\"pct_of_copy\":%.1f}",
                    kernel, dtype, op, kbuf, bytes, moved, ms, gbps, copyGbps, pct);
      emit(line);
      if (pct < worst.pct) {
        worst.pct = pct;
        std::snprintf(line, sizeof line, "%s %s k=%d %zu MiB", kernel, dtype, k, bytes >> 20);
        worst.what = line;
      }
    };

    // reduce2: out = a + b (read a, read b, write out), reduceMulti's two-input case.
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::I32, DType::F64}) {
      size_t n = bytes / elemSize(t);
      const void* two[2] = {in[0], in[1]};
      double ms =
          timer.median([&] { return gpu::reduceMulti(out, two, 2, {n, t, RedOp::Sum}, stream); });
      record("reduce2", dtypeStr(t), "sum", 0, 3.0 * bytes, ms, worstReduce);
    }
    // reduceMulti: k inputs, one output.
    for (DType t : {DType::F32, DType::F16, DType::BF16}) {
      size_t n = bytes / elemSize(t);
      for (int k : {2, 4, 8}) {
        double ms = timer.median([&] {
          return gpu::reduceMulti(out, const_cast<const void* const*>(in.data()), k,
                                  {n, t, RedOp::Sum}, stream);
        });
        record("reduceMulti", dtypeStr(t), "sum", k, (k + 1.0) * bytes, ms, worstReduce);
      }
    }
    // The wire: n floats <-> n 16-bit values (n = bytes / 4).
    size_t n = bytes / 4;
    for (Wire w : {Wire::F16, Wire::BF16}) {
      const char* wn = w == Wire::F16 ? "float16" : "bfloat16";
      double ms = timer.median([&] {
        return gpu::packToWire(out, static_cast<const float*>(in[0]), n,
                               {w, w == Wire::F16 ? overflows : nullptr}, stream);
      });
      record("packToWire", wn, "none", 0, 6.0 * n, ms, worstWire);
      ms = timer.median([&] {
        return gpu::unpackFromWire(static_cast<float*>(out), in[1], n, w, stream);
      });
      record("unpackFromWire", wn, "none", 0, 6.0 * n, ms, worstWire);
    }

    CUDA_OK(cudaDeviceSynchronize());
    for (auto p : in) CUDA_OK(cudaFree(p));
    CUDA_OK(cudaFree(out));
    CUDA_OK(cudaFree(overflows));
  }

  char sum[1024];
  std::snprintf(sum, sizeof sum,
                "{\"summary\":{\"device\":\"%s\",\"iterations\":%d,\"copy_gbps\":%.1f,"
                "\"min_reduce_pct_of_copy\":%.1f,\"worst_reduce\":\"%s\","
                "\"min_wire_pct_of_copy\":%.1f,\"worst_wire\":\"%s\",\"target_pct\":85,"
                "\"meets_target\":%s}}",
                prop.name, iters, firstCopy, worstReduce.pct, worstReduce.what.c_str(),
                worstWire.pct, worstWire.what.c_str(), worstReduce.pct >= 85.0 ? "true" : "false");
  emit(sum);

  if (jsonPath != nullptr) {
    FILE* f = std::fopen(jsonPath, "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kernel_bench: cannot write %s\n", jsonPath);
      return 1;
    }
    std::fprintf(f, "[\n");
    for (size_t i = 0; i < gRecords.size(); ++i)
      std::fprintf(f, "  %s%s\n", gRecords[i].c_str(), i + 1 < gRecords.size() ? "," : "");
    std::fprintf(f, "]\n");
    std::fclose(f);
  }
  CUDA_OK(cudaStreamDestroy(stream));
  return 0;
}
