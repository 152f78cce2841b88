#pragma once
// Device memory for a collective's intermediate blocks, reused by the next
// collective on the same stream (so it needs no synchronization). It grows
// at least twofold when a collective needs more; an outgrown buffer may
// still be read by work queued on the stream, so it is freed with the
// scratch, not when it is outgrown (all of them together stay under twice
// the largest).
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace smdccl {

class DeviceScratch {
 public:
  // On the current device. `what`: what the memory is for, and `advice`:
  // what to change when it cannot be had (see allocateDeviceMemory);
  // `freeCached` likewise.
  DeviceScratch(std::function<void()> freeCached, std::string what, std::string advice);
  // Frees every buffer: the caller has drained the stream.
  ~DeviceScratch();
  DeviceScratch(const DeviceScratch&) = delete;
  DeviceScratch& operator=(const DeviceScratch&) = delete;

  // At least `bytes` of device memory (contents undefined).
  char* reserve(size_t bytes);

 private:
  std::function<void()> freeCached_;
  std::string what_, advice_;
  char* data_ = nullptr;
  size_t bytes_ = 0;
  std::vector<char*> outgrown_;
};

}  // namespace smdccl
