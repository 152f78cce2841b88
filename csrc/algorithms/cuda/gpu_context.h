#pragma once
// What the GPU paths of one group keep between collectives: the internal
// stream they run on, the node's CUDA IPC buffers, pinned host staging, and
// their tuning (SMDCCL_CUDA_*). Torch-free: the backend hands in the stream.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/cuda/node_barrier.h"
#include "algorithms/gpu_tuning.h"
#include "algorithms/intra_engine.h"
#include "algorithms/stream_gate.h"
#include "common/store.h"
#include "transport/cuda/ipc_space.h"
#include "transport/cuda/nccl_comm.h"
#include "transport/cuda/pinned_buffer.h"

namespace smdccl {

struct Comm;
struct Hierarchy;
struct Tuning;
class CudaStageDevice;

class GpuContext {
 public:
  // `freeCached`: hands torch's idle cached device blocks back to CUDA; run
  // once before giving up on an allocation of smdccl's own (may be empty).
  GpuContext(int device, cudaStream_t stream, KVStore& store, GpuTuning tuning,
             std::function<void()> freeCached = nullptr);
  // Waits (up to kDrainWait) for the stream to drain; past that its buffers are leaked.
  ~GpuContext();
  static constexpr std::chrono::seconds kDrainWait{10};

  cudaStream_t stream() const { return stream_; }
  const GpuTuning& tuning() const { return tuning_; }
  PinnedBuffer& staging() { return *staging_; }
  const PinnedBuffer& staging() const { return *staging_; }
  // The device side of the staged schedules (made at first use).
  CudaStageDevice& stage();
  // Whether the node barriers of the IPC steps are queued on the stream
  // (decided at ipc()'s set-up): an op with IPC steps can then be queued whole.
  bool streamBarriers() const { return nodeBarrier_ != nullptr; }
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
  // The engine of this group's CUDA collectives inside the node (NCCL or
  // smdccl's IPC; algorithms/intra_engine.h), decided at the first one the
  // node's ranks make together (a store round among them), then kept.
  const IntraChoice& intra(const Hierarchy& h, Deadline deadline);
  // The node's NCCL communicator (made at first use; intra() chose NCCL).
  NcclNodeComm& nccl(const Hierarchy& h, Deadline deadline);
  // The node's IPC buffers (and its stream barriers, SMDCCL_CUDA_STREAM_BARRIER),
  // set up on first use: a collective over the node (every node-mate asks at
  // the same collective, in issue order). h: the group's nodes.
  CudaIpcSpace& ipc(const Hierarchy& h, Deadline deadline);
  // The node's ranks are all done with the step `what` of the IPC
  // collective c (local: its node). With stream barriers, queued on the
  // stream (the host goes on at once); otherwise the host waits for this
  // rank's stream, then meets its node-mates.
  void nodeBarrier(Comm& c, Comm& local, const char* what);
  // The latest stream barrier queued (0 without them): an op notes it
  // before and after its steps for barrierFailure().
  uint32_t barrierEpoch() const;
  // The stream barriers' failure record (nullptr without them): an op
  // whose barriers a failure let pass unmet has failed.
  std::shared_ptr<const BarrierFailure> barrierFailure() const;
  // Called on the watch thread when a stream barrier times out; nullptr:
  // nobody (the backend clears it before it goes).
  void onBarrierFailure(std::function<void(const std::string&)> handler);
  // The group was aborted: the stream passes the barriers it has queued.
  void abortBarriers(const std::string& cause);
  // The gate of the collectives that run on the host between a copy in and
  // a copy out (algorithms/stream_gate.h), on this context's stream, made
  // at first use: nullptr with SMDCCL_CUDA_STREAM_BARRIER=0, or where the
  // GPU cannot map its flag (the host then waits for the copies).
  StreamGate* gate();
  // The stream's flag queue for gate()'s holds.
  FlagQueue& gateQueue() { return *gateQueue_; }
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
  std::unique_ptr<PinnedBuffer> staging_;  // (leaked, like the IPC buffers, if the stream hangs)
  std::vector<cudaEvent_t> events_;
  std::unique_ptr<CudaIpcSpace> ipc_;
  std::unique_ptr<IntraChoice> intra_;
  std::unique_ptr<NcclNodeComm> nccl_;  // under handlerMu_: abort() may read it from any thread
  std::unique_ptr<GpuNodeBarrier> nodeBarrier_;
  bool gateTried_ = false;
  std::unique_ptr<MappedFlagPage> gatePage_;
  std::unique_ptr<CudaFlagQueue> gateQueue_;
  std::unique_ptr<StreamGate> gate_;
  std::mutex handlerMu_;
  std::function<void(const std::string&)> barrierFailed_;
  std::unique_ptr<CudaStageDevice> stage_;
  std::function<void()> freeCached_;
  std::atomic<uint64_t> bytesToHost_{0}, bytesFromHost_{0};
  bool tuningAgreed_ = false;
};

}  // namespace smdccl
