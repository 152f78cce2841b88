#pragma once
// The GPU's StageDevice (algorithms/stage_device.h): copies out to pinned
// slots on a stream of its own and back in on another, both ordered after
// the op's stream; a 16-bit wire is packed and unpacked (and reduced) by
// the wire kernels in device scratch, so only the packed bytes cross PCIe.
//
// Gated (stream memory operations on a flag page the GPU maps): each copy
// is queued when planned, behind a wait on its lane's gate flag, and
// followed by a write of its number to the lane's progress flag; go() is a
// host store to the gate, done() a read of the progress. The op is then on
// the GPU whole before its proxy runs. Ungated (SMDCCL_CUDA_STREAM_BARRIER=0,
// or no stream memory operations): a copy is queued when go() lets it, and
// done() queries an event behind it.
//
// A group keeps one (GpuContext::stage()) across ops. Per op: begin(), the
// schedules' plans (with joinStream() / followStream() between them where
// the op's stream has work of its own in between), queueEnd(), the proxies'
// run(), finish(); after a failure abandon() and fail() in place of the last two.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "algorithms/gated_lane.h"
#include "algorithms/op_context.h"
#include "algorithms/stage_device.h"
#include "algorithms/staged_ring.h"
#include "transport/cuda/stream_flags.h"
#include "transport/device_wide_fence.h"

namespace smdccl {

class CudaStageDevice final : public StageDevice {
 public:
  // `freeCached`: see allocateDeviceMemory (transport/cuda/ipc_space.h).
  // `gated`: try the gated mode (falls back, with a log line, where the GPU
  // cannot map the flags).
  explicit CudaStageDevice(std::function<void()> freeCached = nullptr, bool gated = false);
  ~CudaStageDevice() override;
  CudaStageDevice(const CudaStageDevice&) = delete;
  CudaStageDevice& operator=(const CudaStageDevice&) = delete;
  bool gated() const override { return gatedLanes_; }

  // The op's copies wait for what `opStream` has queued; `slots` are the
  // plan's pinned host slots (each slot's device scratch, for packing and
  // reducing, is found by its place among them; `scratch` false: the op
  // only copies bytes, and needs none).
  void begin(cudaStream_t opStream, char* slots, const StagePlan& plan, const OpContext& ctx,
             bool scratch = true);
  // `opStream` waits for every copy planned so far (queued now).
  void joinStream();
  // The copies planned from now on wait for what `opStream` has queued so far.
  void followStream();
  // After the op's last plan: `opStream` waits for all its copies, and the
  // count of fp16 values the packing turned into inf is copied out behind them.
  void queueEnd();
  // After the proxies ran: adds that count to this thread's (which the
  // backend's overflow check reads); waits for it with the op's deadline.
  void finish();
  // After a failure: `opStream` still waits for what was queued, nothing
  // else (call abandon() first).
  void fail() noexcept;

 protected:
  void planned(int lane, uint64_t number, const Copy& c) override;
  void release(int lane, uint64_t number) override;
  bool ran(int lane, uint64_t number) override;
  void dropPlanned(int lane, uint64_t released, uint64_t planned) override;
  void abandoned() override { window_.close(); }

 private:
  // Ungated: events are reused in turn; one whose copy is about to be
  // reused is waited for first (with the op's deadline).
  static constexpr uint64_t kEvents = 64;
  struct Lane {
    cudaStream_t stream = nullptr;
    // Ungated.
    std::vector<cudaEvent_t> events;
    uint64_t issued = 0, completed = 0;
    std::deque<Copy> waiting;              // planned, not released
    std::map<uint64_t, uint64_t> eventOf;  // released copy number -> event sequence
    uint64_t queuedUpTo = 0;
    // Gated.
    std::unique_ptr<CudaFlagQueue> flags;
    std::unique_ptr<GatedLane> gate;
  };
  uint64_t record(Lane& l);
  // The out lane's later work waits for what the in lane has queued.
  void inJoinsOut();
  bool eventDone(Lane& l, uint64_t seq);
  size_t slotIndex(const void* slot) const;
  char* scratch(int lane, size_t slot) const;
  void queueCopy(int lane, const Copy& c);
  void queueOut(cudaStream_t s, const Copy& c);
  void queueIn(cudaStream_t s, const Copy& c);

  Lane lanes_[2];  // 0: out to host, 1: in from host
  std::unique_ptr<MappedFlagPage> flagPage_;
  bool gatedLanes_ = false;
  bool abandoned_ = false;   // copies were let go: begin() waits for them
  char* scratch_ = nullptr;  // per slot: slotBytes / 2 out, slotBytes in
  size_t scratchBytes_ = 0;
  // Outgrown scratch, freed with the device: cudaFree waits for the whole
  // device, which on the op's thread would hold the op behind the user's
  // queued work (a few at most: the need is bounded by the tuning).
  std::vector<char*> outgrown_;
  // Gated: open from begin() until every planned copy is let go
  // (transport/device_wide_fence.h).
  DeviceWideFence::Window window_;
  std::function<void()> freeCached_;
  unsigned long long* overflowsDev_ = nullptr;
  unsigned long long* overflowsHost_ = nullptr;  // pinned
  cudaEvent_t opMark_ = nullptr, laneMark_ = nullptr, counted_ = nullptr;
  // The running op.
  cudaStream_t opStream_ = nullptr;
  char* slots_ = nullptr;
  StagePlan plan_{};
  const OpContext* ctx_ = nullptr;
};

}  // namespace smdccl
