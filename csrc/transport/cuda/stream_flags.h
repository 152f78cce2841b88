#pragma once
// FlagQueue on a CUDA stream (algorithms/stream_barrier.h): the write and
// the wait are stream memory operations (cuStreamWriteValue32 /
// cuStreamWaitValue32), queued like kernels, on flags in host shared memory
// that the GPU maps. The wait holds the stream's later work in the GPU's
// front end, not on an SM: ranks that share one GPU are time-sliced, and a
// spinning kernel would hold the GPU while its peer cannot run.
//
// The driver functions are looked up through the runtime
// (cudaGetDriverEntryPointByVersion), so the module still loads where there
// is no driver (CI).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "algorithms/stream_barrier.h"

namespace smdccl {

// Makes [base, base + bytes) (page-aligned host memory, whole pages) visible
// to the current device and checks that its streams can write and wait on
// it, with `probeWord` (a word in it that nothing else uses meanwhile, left
// zero): "" when done, else why not (no stream memory operations,
// registration refused). undoStreamFlags() undoes it.
std::string attachStreamFlags(char* base, size_t bytes, char* probeWord);
void undoStreamFlags(char* base);

// A page of this process's host memory that the current device maps, for
// flags of its own (a StreamGate's).
class MappedFlagPage {
 public:
  MappedFlagPage();
  ~MappedFlagPage();
  MappedFlagPage(const MappedFlagPage&) = delete;
  MappedFlagPage& operator=(const MappedFlagPage&) = delete;
  // "" when the device maps it, else why not.
  const std::string& why() const { return why_; }
  char* base() const { return base_; }

 private:
  char* base_ = nullptr;
  bool attached_ = false;
  std::string why_;
};

class CudaFlagQueue : public FlagQueue {
 public:
  // `base`: the memory attachStreamFlags() made visible.
  CudaFlagQueue(cudaStream_t stream, char* base);
  void write(uint32_t* flag, uint32_t value) override;
  void waitFor(const uint32_t* flag, uint32_t value) override;

 private:
  uint64_t device(const uint32_t* flag) const;
  cudaStream_t stream_;
  char* host_;
  uint64_t device_;  // where the GPU sees host_
};

}  // namespace smdccl
