#include "transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "common/error.h"

namespace smdccl {

static void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) throwSystemError("mmap of shared memory " + name, err);
  return p;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throwSystemError("shm_open(create) " + name, errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throwSystemError(strCat("ftruncate of shared memory ", name, " to ", bytes,
                            " bytes (is /dev/shm large enough?)"),
                     err);
  }
  return ShmSegment(mapFd(fd, bytes, name), bytes);
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0) throwSystemError("shm_open " + name, errno);
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < bytes) {
    close(fd);
    throw CommError(CommError::Kind::System,
                    strCat("shared memory ", name, " is smaller than expected ", bytes));
  }
  return ShmSegment(mapFd(fd, bytes, name), bytes);
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

ShmSegment::ShmSegment(ShmSegment&& o) noexcept : addr_(o.addr_), size_(o.size_) {
  o.addr_ = nullptr;
  o.size_ = 0;
}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    if (addr_) munmap(addr_, size_);
    addr_ = o.addr_;
    size_ = o.size_;
    o.addr_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

ShmSegment::~ShmSegment() {
  if (addr_) munmap(addr_, size_);
}

}  // namespace smdccl
