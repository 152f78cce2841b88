#include "transport/cuda/stream_flags.h"

#include <cuda.h>
#include <dlfcn.h>
#include <sys/mman.h>

#include <atomic>

#include "transport/cuda/cuda_check.h"
#include "common/calls_in_flight.h"

namespace smdccl {

namespace {

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct MemOps {
  WaitValue32 wait = nullptr;
  WriteValue32 write = nullptr;
  std::string why;  // "" when both were found
};

// From the driver the runtime has loaded (libcuda.so.1), by their versioned
// names: the runtime's lookup (cudaGetDriverEntryPointByVersion) needs a
// cudart of 12.5 or newer, and the module must load beside torch's cudart,
// whatever its version, and where there is no driver at all (CI).
const MemOps& memOps() {
  static const MemOps ops = [] {
    MemOps m;
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!driver) {
      m.why = "the CUDA driver (libcuda.so.1) is not loaded";
      return m;
    }
    m.wait = reinterpret_cast<WaitValue32>(dlsym(driver, "cuStreamWaitValue32_v2"));
    m.write = reinterpret_cast<WriteValue32>(dlsym(driver, "cuStreamWriteValue32_v2"));
    if (!m.wait || !m.write)
      m.why = "the CUDA driver has no cuStreamWaitValue32_v2 / cuStreamWriteValue32_v2";
    return m;
  }();
  return ops;
}

[[noreturn]] void throwDriverError(CUresult r, const char* what) {
  throw CommError(CommError::Kind::System,
                  strCat("CUDA driver error ", static_cast<int>(r), " in ", what));
}

// "" when a stream can write `word` (registered memory) and wait for it.
std::string probeStreamFlags(char* word) {
  void* dev = nullptr;
  if (cudaHostGetDevicePointer(&dev, word, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    return "the GPU cannot map the flags";
  }
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    (void)cudaGetLastError();
    return "no stream to try stream memory operations on";
  }
  const auto d = reinterpret_cast<CUdeviceptr>(dev);
  CUresult w = memOps().write(reinterpret_cast<CUstream>(s), d, 7, CU_STREAM_WRITE_VALUE_DEFAULT);
  CUresult v = w == CUDA_SUCCESS
                   ? memOps().wait(reinterpret_cast<CUstream>(s), d, 7, CU_STREAM_WAIT_VALUE_GEQ)
                   : w;
  cudaError_t done = cudaStreamSynchronize(s);
  cudaStreamDestroy(s);
  (void)cudaGetLastError();
  const uint32_t seen = reinterpret_cast<std::atomic<uint32_t>*>(word)->load();
  reinterpret_cast<std::atomic<uint32_t>*>(word)->store(0);
  if (w != CUDA_SUCCESS || v != CUDA_SUCCESS || done != cudaSuccess || seen != 7)
    return strCat("stream memory operations do not work on this GPU (driver result ",
                  static_cast<int>(w != CUDA_SUCCESS ? w : v), ")");
  return "";
}

}  // namespace

std::string attachStreamFlags(char* base, size_t bytes, char* probeWord) {
  const MemOps& ops = memOps();
  if (!ops.why.empty()) return ops.why;
  cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return strCat("cudaHostRegister of the flags failed: ", cudaGetErrorString(e));
  }
  // A device may lack stream memory operations: try one write and one wait
  // on a word of this process's own, on a stream of its own, so that a node
  // falls back together rather than failing at its first barrier.
  std::string why = probeStreamFlags(probeWord);
  if (!why.empty()) undoStreamFlags(base);
  return why;
}

void undoStreamFlags(char* base) {
  if (cudaHostUnregister(base) != cudaSuccess) (void)cudaGetLastError();
}

namespace {
constexpr size_t kPage = 4096;
}  // namespace

MappedFlagPage::MappedFlagPage() {
  // Shared, not private: after a fork() (DataLoader workers) a private page
  // would be copied on the parent's next write, away from what the GPU maps.
  void* p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    why_ = "mmap of a flag page failed";
    return;
  }
  base_ = static_cast<char*>(p);                              // zero-filled
  why_ = attachStreamFlags(base_, kPage, base_ + kPage - 4);  // the gate's flag is the first word
  attached_ = why_.empty();
}

MappedFlagPage::~MappedFlagPage() {
  if (attached_) undoStreamFlags(base_);
  if (base_) munmap(base_, kPage);
}

CudaFlagQueue::CudaFlagQueue(cudaStream_t stream, char* base) : stream_(stream), host_(base) {
  void* d = nullptr;
  SMDCCL_CUDA_CHECK(cudaHostGetDevicePointer(&d, base, 0));
  device_ = reinterpret_cast<uint64_t>(d);
}

uint64_t CudaFlagQueue::device(const uint32_t* flag) const {
  return device_ + static_cast<uint64_t>(reinterpret_cast<const char*>(flag) - host_);
}

void CudaFlagQueue::write(uint32_t* flag, uint32_t value) {
  CallInFlight call("cuStreamWriteValue32 (a flag write on a stream)");
  // The default flags fence the stream's earlier writes before this one
  // (as __threadfence_system() would): a peer that sees the flag sees them.
  CUresult r = memOps().write(reinterpret_cast<CUstream>(stream_), device(flag), value,
                              CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) throwDriverError(r, "cuStreamWriteValue32 (a node barrier's arrival)");
}

void CudaFlagQueue::waitFor(const uint32_t* flag, uint32_t value) {
  CallInFlight call("cuStreamWaitValue32 (a gate or barrier wait on a stream)");
  CUresult r = memOps().wait(reinterpret_cast<CUstream>(stream_), device(flag), value,
                             CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) throwDriverError(r, "cuStreamWaitValue32 (a node barrier's wait)");
}

}  // namespace smdccl
