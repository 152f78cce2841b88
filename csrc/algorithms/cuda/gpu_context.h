#pragma once
// What the GPU paths of one group keep between collectives: the internal
// stream they run on, the node's CUDA IPC buffers, pinned host staging, and
// their tuning (SMDCCL_CUDA_*). Torch-free: the backend hands in the stream.
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "algorithms/gpu_tuning.h"
#include "algorithms/intra_engine.h"
#include "common/op_context.h"
#include "common/store.h"
#include "transport/cuda/device_scratch.h"
#include "transport/cuda/ipc_space.h"
#include "transport/cuda/nccl_comm.h"
#include "transport/cuda/pinned_buffer.h"
#include "transport/cuda/stream_watch.h"

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
  // The device side of the staged schedules (made at first use).
  CudaStageDevice& stage();
  // Device memory for one collective's intermediate blocks (the two-level
  // NCCL paths), at least `bytes`; the next collective on the stream reuses it.
  char* scratch(size_t bytes);
  // Bytes the group's staged collectives copied from device to host memory
  // and back (what crosses PCIe): counted by every staging path.
  void countCopies(uint64_t toHost, uint64_t fromHost) {
    bytesToHost_ += toHost;
    bytesFromHost_ += fromHost;
  }
  uint64_t bytesToHost() const { return bytesToHost_.load(); }
  uint64_t bytesFromHost() const { return bytesFromHost_.load(); }
  // The engine of this group's CUDA collectives inside the nodes (NCCL or
  // smdccl's IPC; algorithms/intra_engine.h), decided at the first one the
  // group's ranks make together (a store round among them), then kept.
  const IntraChoice& intra(const Hierarchy& h, Deadline deadline);
  // The node's NCCL communicator (made at first use; intra() chose NCCL).
  NcclNodeComm& nccl(const Hierarchy& h, Deadline deadline);
  // Whether intra() has chosen NCCL (false before it decided). Any thread.
  bool ncclChosen() const { return ncclChosen_.load(std::memory_order_acquire); }
  // After an op queued NCCL's work on the stream: if it has not finished by
  // ctx's deadline (a node-mate gone or stalled), or NCCL reports an error,
  // the NCCL communicator is aborted (its kernels stop, the stream drains)
  // and the failure handler is told, naming the op. Never blocks.
  void watchNccl(const OpContext& ctx);
  // Where an op starting on the progress thread (prepare) learns of such a
  // failure (its Work reports it): with the collective it starts in (seq),
  // so that every op fused into a collective is told (OpFailures).
  void joinOpFailure(uint64_t seq, std::shared_ptr<WatchedFailure> f) {
    opFailures_.join(seq, std::move(f));
  }
  // Called (on the watch's thread) when NCCL's work failed after its op had
  // returned; nullptr: nobody (the backend clears it before it goes, and
  // this waits for a call in progress).
  void onDeviceFailure(std::function<void(const std::string&)> handler);
  // The group failed or was aborted (`why`): every op whose NCCL work has
  // not finished is told `why` (its Work fails), then NCCL's kernels stop
  // waiting for peers.
  void abort(const std::string& why);
  // The node's IPC buffers, set up on first use: a collective over the node
  // (every node-mate asks at the same collective, in issue order). h: the
  // group's nodes.
  CudaIpcSpace& ipc(const Hierarchy& h, Deadline deadline);
  // The node's ranks are all done with the step `what` of the IPC
  // collective c (local: its node): the host waits for this rank's stream,
  // then meets its node-mates (a host barrier, with c's deadline).
  void nodeBarrier(Comm& c, Comm& local, const char* what);
  // Once per group, at its first GPU collective (every rank calls it there):
  // the ranks' SMDCCL_CUDA_* must agree, or they take different paths (a
  // rank with SMDCCL_CUDA_IPC=0 among IPC ranks would leave its node-mates
  // waiting for its buffer until the timeout). Raises a Mismatch naming
  // both ranks' settings.
  void agreeOnTuning(Comm& c, const Tuning& t);

 private:
  // The NCCL watch found NCCL's work failed: aborts NCCL, tells the handler.
  void ncclFailed(const std::string& why);

  int device_;
  cudaStream_t stream_;
  KVStore& store_;
  GpuTuning tuning_;
  std::unique_ptr<PinnedBuffer> staging_;  // (leaked, like the IPC buffers, if the stream hangs)
  std::unique_ptr<CudaIpcSpace> ipc_;
  std::unique_ptr<IntraChoice> intra_;
  std::atomic<bool> ncclChosen_{false};
  std::unique_ptr<NcclNodeComm> nccl_;  // under handlerMu_: abort() may read it from any thread
  std::unique_ptr<StreamWatch> ncclWatch_;  // made with nccl_
  OpFailures opFailures_;                   // the progress thread's
  std::mutex handlerMu_;
  std::mutex tellMu_;  // held while deviceFailed_ runs (onDeviceFailure waits for it)
  std::function<void(const std::string&)> deviceFailed_;
  std::unique_ptr<CudaStageDevice> stage_;
  std::unique_ptr<DeviceScratch> scratch_;
  std::function<void()> freeCached_;
  std::atomic<uint64_t> bytesToHost_{0}, bytesFromHost_{0};
  bool tuningAgreed_ = false;
};

}  // namespace smdccl
