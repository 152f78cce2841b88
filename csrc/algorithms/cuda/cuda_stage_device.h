#pragma once
// The GPU's StageDevice (algorithms/stage_device.h): copies out to pinned
// slots on a stream of its own and back in on another, both ordered after
// the op's stream; a 16-bit wire is packed and unpacked by the wire
// kernels in device scratch, so only the packed bytes cross PCIe. A copy
// is queued when go() lets it, and done() queries an event behind it
// (events pooled: none is created or destroyed per op).
//
// A group keeps one (GpuContext::stage()) across ops. Per op: begin(), the
// schedules (with joinStream() / followStream() between them where
// the op's stream has work of its own in between), queueEnd(), the proxies'
// run(), finish(); after a failure abandon() and fail() in place of the last two.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "common/op_context.h"
#include "algorithms/stage_device.h"
#include "transport/cuda/device_scratch.h"

namespace smdccl {

// Where an op's pinned slots lie: `slots` of `slotBytes` each, in turn.
struct SlotLayout {
  size_t slotBytes = 0;
  int slots = 1;
  size_t hostBytes() const { return static_cast<size_t>(slots) * slotBytes; }
};

class CudaStageDevice final : public StageDevice {
 public:
  // `freeCached`: see allocateDeviceMemory (transport/cuda/ipc_space.h).
  explicit CudaStageDevice(std::function<void()> freeCached = nullptr);
  ~CudaStageDevice() override;
  CudaStageDevice(const CudaStageDevice&) = delete;
  CudaStageDevice& operator=(const CudaStageDevice&) = delete;

  // The op's copies wait for what `opStream` has queued; `slots` are the
  // op's pinned host slots (each slot's device scratch, for packing, is
  // found by its place among them; `scratch` false: the op only copies
  // bytes, and needs none).
  void begin(cudaStream_t opStream, char* slots, const SlotLayout& layout, const OpContext& ctx,
             bool scratch);
  // `opStream` waits for every copy queued so far.
  void joinStream();
  // The copies queued from now on wait for what `opStream` has queued so far.
  void followStream();
  // After the op's last schedule: `opStream` waits for all its copies, and the
  // count of fp16 values the packing turned into inf is copied out behind them.
  void queueEnd();
  // After the proxies ran: adds that count to this thread's (which the
  // backend's overflow check reads); waits for it with the op's deadline.
  void finish();
  // After a failure: `opStream` still waits for what was queued, nothing
  // else (call abandon() first).
  void fail() noexcept;
  void abandon() override;

 protected:
  void queue(int lane, uint64_t number, const Copy& c) override;
  bool ran(int lane, uint64_t number) override;

 private:
  // Events are reused in turn; one whose copy is about to be reused is
  // waited for first (with the op's deadline).
  static constexpr uint64_t kEvents = 64;
  struct Lane {
    cudaStream_t stream = nullptr;
    std::vector<cudaEvent_t> events;
    uint64_t issued = 0, completed = 0;
    std::map<uint64_t, uint64_t> eventOf;  // queued copy number -> event sequence
  };
  uint64_t record(Lane& l);
  // The out lane's later work waits for what the in lane has queued.
  void inJoinsOut();
  bool eventDone(Lane& l, uint64_t seq);
  size_t slotIndex(const void* slot) const;
  char* scratch(int lane, size_t slot) const;
  static size_t scratchHalf(const SlotLayout& layout);
  void queueOut(cudaStream_t s, const Copy& c);
  void queueIn(cudaStream_t s, const Copy& c);

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
  SlotLayout layout_{};
  const OpContext* ctx_ = nullptr;
};

}  // namespace smdccl
