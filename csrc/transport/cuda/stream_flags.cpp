#include "transport/cuda/stream_flags.h"

#include <cuda.h>
#include <sys/mman.h>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

using WaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct MemOps {
  WaitValue32 wait = nullptr;
  WriteValue32 write = nullptr;
  std::string why;  // "" when both were found
};

const MemOps& memOps() {
  static const MemOps ops = [] {
    MemOps m;
    auto find = [&m](const char* name, void** fn) {
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      // The _v2 functions (CUDA 11.7+), as cuda.h maps the names to.
      cudaError_t e = cudaGetDriverEntryPointByVersion(name, fn, 11070, cudaEnableDefault, &found);
      if (e != cudaSuccess || found != cudaDriverEntryPointSuccess || !*fn) {
        (void)cudaGetLastError();
        if (m.why.empty())
          m.why = strCat("the CUDA driver has no ", name, " (",
                         e != cudaSuccess ? cudaGetErrorString(e) : "symbol not found", ")");
      }
    };
    find("cuStreamWaitValue32", reinterpret_cast<void**>(&m.wait));
    find("cuStreamWriteValue32", reinterpret_cast<void**>(&m.write));
    return m;
  }();
  return ops;
}

[[noreturn]] void throwDriverError(CUresult r, const char* what) {
  throw CommError(CommError::Kind::System,
                  strCat("CUDA driver error ", static_cast<int>(r), " in ", what));
}

}  // namespace

std::string attachStreamFlags(char* base, size_t bytes) {
  const MemOps& ops = memOps();
  if (!ops.why.empty()) return ops.why;
  cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return strCat("cudaHostRegister of the node's barrier flags failed: ", cudaGetErrorString(e));
  }
  return "";
}

void undoStreamFlags(char* base) {
  if (cudaHostUnregister(base) != cudaSuccess) (void)cudaGetLastError();
}

namespace {
constexpr size_t kPage = 4096;
}  // namespace

MappedFlagPage::MappedFlagPage() {
  void* p = mmap(nullptr, kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    why_ = "mmap of a flag page failed";
    return;
  }
  base_ = static_cast<char*>(p);  // zero-filled
  why_ = attachStreamFlags(base_, kPage);
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
  // The default flags fence the stream's earlier writes before this one
  // (as __threadfence_system() would): a peer that sees the flag sees them.
  CUresult r = memOps().write(reinterpret_cast<CUstream>(stream_), device(flag), value,
                              CU_STREAM_WRITE_VALUE_DEFAULT);
  if (r != CUDA_SUCCESS) throwDriverError(r, "cuStreamWriteValue32 (a node barrier's arrival)");
}

void CudaFlagQueue::waitFor(const uint32_t* flag, uint32_t value) {
  CUresult r = memOps().wait(reinterpret_cast<CUstream>(stream_), device(flag), value,
                             CU_STREAM_WAIT_VALUE_GEQ);
  if (r != CUDA_SUCCESS) throwDriverError(r, "cuStreamWaitValue32 (a node barrier's wait)");
}

}  // namespace smdccl
