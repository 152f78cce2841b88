// The CUDA FlagQueue (transport/cuda/stream_flags.h) on a GPU: stream memory
// operations on flags in registered host memory order two streams as
// StreamBarrier says, and StreamBarrier::release() lets a stream that waits
// for a rank that never comes drain. The barrier's logic itself runs in CI
// (tests/cpp/test_stream_barrier.cpp, with HostFlagQueue); this checks only
// the CUDA queue. Run by smdccl_cuda_tests (exits 77 without a GPU: see
// test_kernels.cu).
#include <cuda_runtime_api.h>
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "algorithms/stream_barrier.h"
#include "check.h"
#include "transport/cuda/stream_flags.h"

using namespace smdccl;

namespace {

// Keeps its stream busy for about `ns` nanoseconds of GPU time.
__global__ void spin(long long ns) {
  long long start = clock64();
  // clock64 counts SM cycles: ~1-2 per ns on current GPUs; err long.
  while (clock64() - start < 2 * ns) {}
}

// Page-aligned, zeroed host memory for a flag matrix, registered for the GPU.
struct Flags {
  size_t bytes;
  char* base;
  bool attached = false;
  explicit Flags(int localSize) : bytes(4096) {
    base = static_cast<char*>(
        mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    std::memset(base, 0, bytes);
    // The probe word: the last one of the page, beyond the flags.
    attached = attachStreamFlags(base, bytes, base + bytes - 4).empty();
    matrix = {base, localSize};
  }
  ~Flags() {
    if (attached) undoStreamFlags(base);
    munmap(base, bytes);
  }
  FlagMatrix matrix;
};

bool drainsWithin(cudaStream_t s, std::chrono::milliseconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (cudaStreamQuery(s) == cudaErrorNotReady) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  (void)cudaGetLastError();
  return cudaStreamQuery(s) == cudaSuccess;
}

}  // namespace

// Stream a writes x after ~50 ms of work; stream b copies x out after the
// barrier: it must see a's value.
TEST(cuda_flag_queue_orders_two_streams_at_a_barrier) {
  Flags f(2);
  CHECK(f.attached);
  if (!f.attached) return;
  cudaStream_t a, b;
  CHECK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking) == cudaSuccess);
  int *x = nullptr, *y = nullptr;
  CHECK(cudaMalloc(&x, 4) == cudaSuccess && cudaMalloc(&y, 4) == cudaSuccess);
  CHECK(cudaMemset(x, 0, 4) == cudaSuccess && cudaMemset(y, 0, 4) == cudaSuccess);
  CHECK(cudaDeviceSynchronize() == cudaSuccess);
  CudaFlagQueue qa(a, f.base), qb(b, f.base);
  StreamBarrier ba(f.matrix, 0), bb(f.matrix, 1);
  for (int round = 1; round <= 3; ++round) {
    spin<<<1, 1, 0, a>>>(50'000'000);
    CHECK(cudaMemsetAsync(x, round, 4, a) == cudaSuccess);
    ba.arrive(qa);
    bb.arrive(qb);
    CHECK(cudaMemcpyAsync(y, x, 4, cudaMemcpyDeviceToDevice, b) == cudaSuccess);
    ba.arrive(qa);  // a may not write x again before b has copied it
    bb.arrive(qb);
    CHECK(drainsWithin(a, std::chrono::milliseconds(5000)));
    CHECK(drainsWithin(b, std::chrono::milliseconds(5000)));
    int got = 0;
    CHECK(cudaMemcpy(&got, y, 4, cudaMemcpyDeviceToHost) == cudaSuccess);
    const int want = round | round << 8 | round << 16 | round << 24;  // memset's bytes
    CHECK(got == want);
  }
  CHECK(ba.lastEpoch() == 6 && ba.missing(6).empty());
  cudaFree(x);
  cudaFree(y);
  cudaStreamDestroy(a);
  cudaStreamDestroy(b);
}

// Rank 1 never arrives: rank 0's stream stops at the barrier, and
// release() lets it drain.
TEST(cuda_flag_queue_release_drains_a_waiting_stream) {
  Flags f(2);
  CHECK(f.attached);
  if (!f.attached) return;
  cudaStream_t s;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
  CudaFlagQueue q(s, f.base);
  StreamBarrier b(f.matrix, 0);
  uint32_t e = b.arrive(q);
  CHECK(!drainsWithin(s, std::chrono::milliseconds(200)));
  CHECK(b.missing(e) == std::vector<int>{1});
  // The arrival the stream wrote for rank 1's row reached host memory.
  CHECK(*f.matrix.slot(1, 0) == e);
  b.release();
  CHECK(drainsWithin(s, std::chrono::milliseconds(5000)));
  cudaStreamDestroy(s);
}
