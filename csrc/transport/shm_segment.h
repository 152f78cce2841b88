#pragma once
// A POSIX shared-memory segment mapped by every rank of one node. The name is
// unlinked as soon as all have mapped it, so nothing is left in /dev/shm even
// if a process is killed later.
#include <cstdint>
#include <cstddef>
#include <string>

namespace smdccl {

class ShmSegment {
 public:
  static ShmSegment create(const std::string& name, size_t bytes);
  static ShmSegment open(const std::string& name, size_t bytes);
  static void unlink(const std::string& name);  // ignores "already gone"
  // What /dev/shm can still hold, in bytes (UINT64_MAX when it cannot tell).
  static uint64_t freeBytes();

  ShmSegment() = default;
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;
  ~ShmSegment();

  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return size_; }

 private:
  ShmSegment(void* addr, size_t size) : addr_(addr), size_(size) {}
  void* addr_ = nullptr;
  size_t size_ = 0;
};

}  // namespace smdccl
