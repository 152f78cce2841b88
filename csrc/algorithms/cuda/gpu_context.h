#pragma once
// What the GPU paths of one group keep between collectives: the internal
// stream they run on, the node's CUDA IPC buffers, pinned host staging, and
// their tuning (SMDCCL_CUDA_*). Torch-free: the backend hands in the stream.
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/gpu_tuning.h"
#include "common/store.h"
#include "transport/cuda/ipc_space.h"
#include "transport/cuda/pinned_buffer.h"

namespace smdccl {

struct Comm;
struct Tuning;
class CudaStageDevice;

class GpuContext {
 public:
  // `freeCached`: hands torch's idle cached device blocks back to CUDA; run
  // once before giving up on an allocation of smdccl's own (may be empty).
  GpuContext(int device, cudaStream_t stream, KVStore& store, GpuTuning tuning,
             std::function<void()> freeCached = nullptr);
  ~GpuContext();

  cudaStream_t stream() const { return stream_; }
  const GpuTuning& tuning() const { return tuning_; }
  PinnedBuffer& staging() { return staging_; }
  const PinnedBuffer& staging() const { return staging_; }
  // The device side of the staged ring (made at first use).
  CudaStageDevice& stage();
  // Bytes the group's staged collectives copied from device to host memory
  // and back (what crosses PCIe): counted by every staging path.
  void countCopies(uint64_t toHost, uint64_t fromHost) {
    bytesToHost_ += toHost;
    bytesFromHost_ += fromHost;
  }
  uint64_t bytesToHost() const { return bytesToHost_.load(); }
  uint64_t bytesFromHost() const { return bytesFromHost_.load(); }
  // `n` reusable events (timing off), recorded and waited on by one op at a time.
  cudaEvent_t event(size_t i);
  // The node's IPC buffers, mapped on first use: a collective over the node
  // (every node-mate asks at the same collective, in issue order).
  CudaIpcSpace& ipc(int node, int localRank, int localSize, Deadline deadline);
  // Once per group, at its first GPU collective (every rank calls it there):
  // the ranks' SMDCCL_CUDA_* must agree, or they take different paths (a
  // rank with SMDCCL_CUDA_IPC=0 among IPC ranks would leave its node-mates
  // waiting for its buffer until the timeout). Raises a Mismatch naming
  // both ranks' settings.
  void agreeOnTuning(Comm& c, const Tuning& t);

 private:
  int device_;
  cudaStream_t stream_;
  KVStore& store_;
  GpuTuning tuning_;
  PinnedBuffer staging_;
  std::vector<cudaEvent_t> events_;
  std::unique_ptr<CudaIpcSpace> ipc_;
  std::unique_ptr<CudaStageDevice> stage_;
  std::function<void()> freeCached_;
  std::atomic<uint64_t> bytesToHost_{0}, bytesFromHost_{0};
  bool tuningAgreed_ = false;
};

}  // namespace smdccl
