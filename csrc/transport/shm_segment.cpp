#include "transport/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "common/error.h"

namespace smdccl {

static void* mapFd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) throwSystemError("mmap of shared memory " + name, err);
  return p;
}

uint64_t ShmSegment::freeBytes() {
  struct statvfs vfs{};
  if (statvfs("/dev/shm", &vfs) != 0) return UINT64_MAX;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
}

namespace {
std::string tooSmall(const std::string& name, size_t bytes, uint64_t freeBytes) {
  return strCat("shared memory ", name, " needs ", (bytes + (1 << 20) - 1) >> 20,
                " MiB but /dev/shm has ", freeBytes >> 20,
                " MiB free: enlarge /dev/shm (e.g. docker run --shm-size=1g) or lower "
                "SMDCCL_SHM_RING_KB (each node's segment holds local_ranks^2 rings)");
}
}  // namespace

ShmSegment ShmSegment::create(const std::string& name, size_t bytes) {
  // tmpfs hands out pages on first touch: a segment larger than /dev/shm's
  // free space would map fine and then kill the process with SIGBUS in the
  // middle of a collective. Refuse it here (ShmNode sizes its rings to fit
  // first); pages stay lazy, so rings that are never filled cost nothing.
  uint64_t freeBytes = ShmSegment::freeBytes();
  if (bytes > freeBytes) throw CommError(CommError::Kind::System, tooSmall(name, bytes, freeBytes));
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throwSystemError("shm_open(create) " + name, errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    throwSystemError(strCat("ftruncate of shared memory ", name, " to ", bytes, " bytes"), err);
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
