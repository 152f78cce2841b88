#pragma once
// While any thread of the process captures a CUDA graph in the default
// (global) mode - torch.cuda.graph, torch.compile's CUDA graphs - a call
// such as cudaEventQuery or cudaMalloc from any other thread fails and
// invalidates that capture. smdccl's threads make such calls for work the
// user queued earlier (an async collective, an isend), so they run in
// thread-local mode, where a thread's calls concern only its own captures
// (what ProcessGroupNCCL's watchdog does: pytorch#104555, #148594).
// smdccl's own threads switch once, for good; on a caller's thread the
// switch lasts as long as the scope.
#include <cuda_runtime_api.h>

namespace smdccl {

class CaptureSafeScope {
 public:
  CaptureSafeScope();
  ~CaptureSafeScope();
  CaptureSafeScope(const CaptureSafeScope&) = delete;
  CaptureSafeScope& operator=(const CaptureSafeScope&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeThreadLocal;
  bool restore_ = false;
};

}  // namespace smdccl
