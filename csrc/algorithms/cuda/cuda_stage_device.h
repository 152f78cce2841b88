#pragma once
// The GPU's StageDevice (algorithms/stage_device.h): copies out to pinned
// slots on a stream of its own and back in on another, both ordered after
// the op's stream; a 16-bit wire is packed and unpacked (and reduced) by
// the wire kernels in device scratch, so only the packed bytes cross PCIe.
// A ticket is an event on one of the two streams.
//
// A group keeps one (GpuContext::stage()) across ops: begin() before an
// op's staged schedule, finish() after it, also when it failed.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "algorithms/op_context.h"
#include "algorithms/stage_device.h"
#include "algorithms/staged_ring.h"

namespace smdccl {

class CudaStageDevice final : public StageDevice {
 public:
  // `freeCached`: see allocateDeviceMemory (transport/cuda/ipc_space.h).
  explicit CudaStageDevice(std::function<void()> freeCached = nullptr);
  ~CudaStageDevice() override;
  CudaStageDevice(const CudaStageDevice&) = delete;
  CudaStageDevice& operator=(const CudaStageDevice&) = delete;

  // The op's copies wait for what `opStream` has queued; `slots` are the
  // plan's pinned host slots (each slot's device scratch is found by its
  // place among them).
  void begin(cudaStream_t opStream, char* slots, const StagePlan& plan, const OpContext& ctx);
  // `opStream` waits for every copy of the op; fp16 values the packing
  // turned into inf are added to this thread's overflow count, which the
  // backend's overflow check reads. Waits (with the op's deadline) only for
  // that count.
  void finish();
  // After a failure: `opStream` still waits for what was queued, nothing else.
  void abandon() noexcept;

  bool done(Ticket t) override;

 protected:
  Ticket queueToHost(void* slot, const char* src, size_t count, DType dt, Wire wire) override;
  Ticket queueFromHost(char* dst, const void* slot, size_t count, const Unpack& how) override;

 private:
  // Events are reused in turn; a ticket whose event is about to be reused
  // is waited for first (with the op's deadline).
  static constexpr uint64_t kEvents = 64;
  struct Lane {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;
    uint64_t issued = 0, completed = 0;
  };
  Ticket record(int lane);
  cudaEvent_t eventOf(Ticket t) const;
  size_t slotIndex(const void* slot) const;
  char* scratch(int lane, size_t slot) const;
  void joinInto(cudaStream_t s);

  Lane lanes_[2];            // 0: out to host, 1: in from host
  char* scratch_ = nullptr;  // per slot: slotBytes / 2 out, slotBytes in
  size_t scratchBytes_ = 0;
  std::function<void()> freeCached_;
  unsigned long long* overflowsDev_ = nullptr;
  unsigned long long* overflowsHost_ = nullptr;  // pinned
  cudaEvent_t start_ = nullptr;
  // The running op.
  cudaStream_t opStream_ = nullptr;
  char* slots_ = nullptr;
  StagePlan plan_{};
  const OpContext* ctx_ = nullptr;
};

}  // namespace smdccl
