#include "transport/cuda/stream_memops.h"

#include <mutex>

#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// Driver API types, as in cuda.h (not included: it would tie us to its
// versioned symbol names).
using CUresult = int;
constexpr CUresult kSuccess = 0;
constexpr CUresult kNotSupported = 801;  // CUDA_ERROR_NOT_SUPPORTED
constexpr unsigned kWaitGeq = 0x0;       // CU_STREAM_WAIT_VALUE_GEQ
constexpr unsigned kWriteDefault = 0x0;  // CU_STREAM_WRITE_VALUE_DEFAULT (fenced)
using MemOpFn = CUresult (*)(cudaStream_t, unsigned long long, unsigned long long, unsigned);

struct DriverOps {
  MemOpFn wait = nullptr;
  MemOpFn write = nullptr;
};

const DriverOps& driverOps() {
  static DriverOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q;
    void* fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue64", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess && q == cudaDriverEntryPointSuccess)
      ops.wait = reinterpret_cast<MemOpFn>(fn);
    fn = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWriteValue64", &fn, 12000, cudaEnableDefault, &q) ==
            cudaSuccess && q == cudaDriverEntryPointSuccess)
      ops.write = reinterpret_cast<MemOpFn>(fn);
    cudaGetLastError();  // a failed query must not linger as the sticky "last error"
  });
  return ops;
}

bool run(MemOpFn fn, cudaStream_t stream, volatile uint64_t* counter, uint64_t value,
         unsigned flags, const char* what) {
  if (!fn) return false;
  void* dev = nullptr;
  SMDCCL_CUDA_CHECK(cudaHostGetDevicePointer(&dev, const_cast<uint64_t*>(counter), 0));
  CUresult r = fn(stream, reinterpret_cast<unsigned long long>(dev), value, flags);
  if (r == kSuccess) return true;
  if (r == kNotSupported) return false;
  throw CommError(CommError::Kind::System, strCat("CUDA driver error ", r, " in ", what));
}

}  // namespace

bool streamWaitAtLeast(cudaStream_t stream, volatile uint64_t* counter, uint64_t value) {
  return run(driverOps().wait, stream, counter, value, kWaitGeq, "cuStreamWaitValue64");
}

bool streamWrite(cudaStream_t stream, volatile uint64_t* counter, uint64_t value) {
  return run(driverOps().write, stream, counter, value, kWriteDefault, "cuStreamWriteValue64");
}

}  // namespace smdccl
