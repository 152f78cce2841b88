#include "transport/cuda/device_scratch.h"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "common/calls_in_flight.h"
#include "transport/cuda/ipc_space.h"

namespace smdccl {

DeviceScratch::DeviceScratch(std::function<void()> freeCached, std::string what, std::string advice)
    : freeCached_(std::move(freeCached)), what_(std::move(what)), advice_(std::move(advice)) {}

DeviceScratch::~DeviceScratch() {
  for (char* p : outgrown_) cudaFree(p);
  if (data_) cudaFree(data_);
}

char* DeviceScratch::reserve(size_t bytes) {
  if (bytes <= bytes_) return data_;
  const size_t grown = std::max(bytes, 2 * bytes_);
  int device = -1;
  (void)cudaGetDevice(&device);
  CallInFlight call("cudaMalloc of a collective's device scratch");
  char* p = static_cast<char*>(allocateDeviceMemory(grown, device, freeCached_, what_, advice_));
  if (data_) outgrown_.push_back(data_);
  data_ = p;
  bytes_ = grown;
  return data_;
}

}  // namespace smdccl
