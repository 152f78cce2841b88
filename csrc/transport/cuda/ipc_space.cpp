#include "transport/cuda/ipc_space.h"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <cstring>

#include "common/log.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

std::string toHex(const void* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  auto* b = static_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) {
    s += digits[b[i] >> 4];
    s += digits[b[i] & 15];
  }
  return s;
}

void fromHex(const std::string& s, void* p, size_t n) {
  auto nib = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  if (s.size() != 2 * n) throw CommError(CommError::Kind::Protocol, "malformed CUDA IPC handle");
  auto* b = static_cast<unsigned char*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(nib(s[2 * i]) << 4 | nib(s[2 * i + 1]));
}

// Sets the device for this thread and restores the previous one on exit.
struct DeviceScope {
  int prev = -1;
  explicit DeviceScope(int dev) {
    SMDCCL_CUDA_CHECK(cudaGetDevice(&prev));
    if (prev != dev) SMDCCL_CUDA_CHECK(cudaSetDevice(dev));
  }
  ~DeviceScope() {
    int cur = -1;
    if (cudaGetDevice(&cur) == cudaSuccess && cur != prev) cudaSetDevice(prev);
  }
};

}  // namespace

CudaIpcSpace::CudaIpcSpace(KVStore& store, const std::string& keyPrefix, int localRank,
                           int localSize, int device, size_t bytes, Deadline deadline)
    : localRank_(localRank), device_(device), bytes_(bytes), ptrs_(localSize, nullptr) {
  DeviceScope scope(device);
  void* mine = nullptr;
  SMDCCL_CUDA_CHECK(cudaMalloc(&mine, bytes));
  ptrs_[localRank] = static_cast<char*>(mine);
  try {
    cudaIpcMemHandle_t handle;
    SMDCCL_CUDA_CHECK(cudaIpcGetMemHandle(&handle, mine));
    // The pid makes a stale key from an earlier group of the same name
    // recognisable in logs; the handle itself is what peers open.
    std::vector<std::string> all = allGatherStrings(
        store, keyPrefix, localRank, localSize,
        strCat(getpid(), ":", device, ":", toHex(&handle, sizeof handle)), deadline);
    for (int l = 0; l < localSize; ++l) {
      if (l == localRank) continue;
      const std::string& v = all[static_cast<size_t>(l)];
      size_t colon = v.rfind(':');
      cudaIpcMemHandle_t peer;
      fromHex(v.substr(colon + 1), &peer, sizeof peer);
      void* p = nullptr;
      // Lazy peer access: a buffer on another GPU of the node is reached
      // over NVLink / PCIe; one on this GPU needs none.
      SMDCCL_CUDA_CHECK(cudaIpcOpenMemHandle(&p, peer, cudaIpcMemLazyEnablePeerAccess));
      ptrs_[static_cast<size_t>(l)] = static_cast<char*>(p);
    }
  } catch (...) {
    for (int l = 0; l < localSize; ++l) {
      if (!ptrs_[static_cast<size_t>(l)]) continue;
      if (l == localRank) cudaFree(ptrs_[static_cast<size_t>(l)]);
      else cudaIpcCloseMemHandle(ptrs_[static_cast<size_t>(l)]);
    }
    throw;
  }
  SMDCCL_INFO("CUDA IPC: ", localSize, " buffers of ", bytes >> 10, " KiB mapped on device ",
              device);
}

CudaIpcSpace::~CudaIpcSpace() {
  DeviceScope scope(device_);
  for (size_t l = 0; l < ptrs_.size(); ++l) {
    if (!ptrs_[l]) continue;
    if (static_cast<int>(l) == localRank_) cudaFree(ptrs_[l]);
    else cudaIpcCloseMemHandle(ptrs_[l]);
  }
}

}  // namespace smdccl
