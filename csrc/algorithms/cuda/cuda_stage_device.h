#pragma once
// The GPU's StageDevice (algorithms/stage_device.h): copies out to pinned
// slots on a stream of its own and back in on another, both ordered after
// the op's stream; a 16-bit or int8 wire is packed and unpacked by the wire
// kernels in device scratch, so only the packed bytes cross PCIe. A copy
// is queued when the proxy reaches it, and done() queries an event behind
// it (events pooled: none is created or destroyed per op). A group keeps
// one (GpuContext::stage()) across ops; run() runs one op's rounds.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "common/op_context.h"
#include "algorithms/stage_device.h"
#include "algorithms/staged_rounds.h"
#include "transport/cuda/device_scratch.h"

namespace smdccl {

class CudaStageDevice final : public StageDevice {
 public:
  // `freeCached`: see allocateDeviceMemory (transport/cuda/ipc_space.h).
  explicit CudaStageDevice(std::function<void()> freeCached = nullptr);
  ~CudaStageDevice() override;
  CudaStageDevice(const CudaStageDevice&) = delete;
  CudaStageDevice& operator=(const CudaStageDevice&) = delete;

  // Runs `job` (its schedule planned here) on `slots`, job.hostBytes() of
  // pinned memory: its copies wait for what `opStream` has queued, and
  // `opStream` waits for them; fp16 values the packing turned into inf are
  // added to this thread's count (which the backend's overflow check
  // reads). On a failure `opStream` still waits for what was queued, and
  // the next run() waits for it too.
  void run(cudaStream_t opStream, char* slots, const OpContext& ctx, StagedRoundsJob job);
  void abandon() override;

 protected:
  void queue(int lane, uint64_t number, const Copy& c) override;
  bool ran(int lane, uint64_t number) override;

 private:
  // Waits for the lanes, then frees every handle made (the constructor's
  // failure path too).
  void release() noexcept;
  // Events are reused in turn; one whose copy is about to be reused is
  // waited for first (with the op's deadline).
  static constexpr uint64_t kEvents = 64;
  struct Lane {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;
    uint64_t completed = 0;  // copies up to this number have run
  };
  void begin(cudaStream_t opStream, char* slots, const StagedRoundsJob& job, const OpContext& ctx);
  // `opStream` waits for every copy queued so far (after a failure: errors ignored).
  void joinStream() noexcept;
  // After the op's last copy: `opStream` waits for all of them, and the
  // count of fp16 overflows is copied out behind them.
  void queueEnd();
  // An event behind copy `seq` of lane l (copies are numbered from 1 per lane).
  void record(Lane& l, uint64_t seq);
  // The out lane's later work waits for what the in lane has queued.
  void inJoinsOut();
  size_t slotIndex(const void* slot) const;
  char* scratch(int lane, size_t slot) const;
  size_t scratchHalf() const;

  Lane lanes_[2];  // 0: out to host, 1: in from host
  bool abandoned_ = false;   // an op failed: begin() waits for its copies
  // Outgrown packing scratch is freed with the device: cudaFree waits for
  // the whole device, which on the op's thread would hold the op behind the
  // user's queued work.
  DeviceScratch packing_;
  char* scratch_ = nullptr;  // the op's: per slot, scratchHalf() out, scratchHalf() in
  unsigned long long* overflowsDev_ = nullptr;
  unsigned long long* overflowsHost_ = nullptr;  // pinned
  cudaEvent_t opMark_ = nullptr, laneMark_ = nullptr, counted_ = nullptr;
  // The running op.
  cudaStream_t opStream_ = nullptr;
  char* slots_ = nullptr;
  size_t slotBytes_ = 0;
  int slotCount_ = 1;
  const OpContext* ctx_ = nullptr;
};

}  // namespace smdccl
