#include "transport/cuda/capture_mode.h"

#include "common/own_thread.h"

namespace smdccl {

CaptureSafeScope::CaptureSafeScope() {
  if (isOwnThread()) {
    thread_local bool switched = false;
    if (!switched) switched = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
    return;
  }
  restore_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
}

CaptureSafeScope::~CaptureSafeScope() {
  if (restore_) cudaThreadExchangeStreamCaptureMode(&mode_);
}

}  // namespace smdccl
