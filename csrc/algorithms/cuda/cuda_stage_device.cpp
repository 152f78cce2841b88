#include "algorithms/cuda/cuda_stage_device.h"

#include <cstdint>

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"
#include "transport/cuda/ipc_space.h"
#include "common/calls_in_flight.h"

namespace smdccl {

CudaStageDevice::CudaStageDevice(std::function<void()> freeCached)
    : packing_(std::move(freeCached), "the staged copies' packing scratch",
               "SMDCCL_CUDA_STAGE_CHUNK_KB sizes it (2x the chunk)") {
  for (Lane& l : lanes_) {
    SMDCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    l.events.resize(kEvents);
    for (cudaEvent_t& e : l.events)
      SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  for (cudaEvent_t* e : {&opMark_, &laneMark_, &counted_})
    SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  void* p = nullptr;
  SMDCCL_CUDA_CHECK(cudaMalloc(&p, sizeof(unsigned long long)));
  overflowsDev_ = static_cast<unsigned long long*>(p);
  SMDCCL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(unsigned long long), cudaHostAllocPortable));
  overflowsHost_ = static_cast<unsigned long long*>(p);
}

CudaStageDevice::~CudaStageDevice() {
  // Nothing of ours may still run when the scratch goes.
  abandon();
  for (Lane& l : lanes_) {
    if (l.stream) cudaStreamSynchronize(l.stream);
    for (cudaEvent_t e : l.events) cudaEventDestroy(e);
    if (l.stream) cudaStreamDestroy(l.stream);
  }
  for (cudaEvent_t e : {opMark_, laneMark_, counted_})
    if (e) cudaEventDestroy(e);
  if (overflowsDev_) cudaFree(overflowsDev_);
  if (overflowsHost_) cudaFreeHost(overflowsHost_);
}

void CudaStageDevice::begin(cudaStream_t opStream, char* slots, const SlotLayout& layout,
                            const OpContext& ctx, bool scratch) {
  opStream_ = opStream;
  slots_ = slots;
  layout_ = layout;
  ctx_ = &ctx;
  if (abandoned_) {
    // A failed op's copies already queued still run: none may touch the
    // slots or the scratch of this one.
    for (Lane& l : lanes_) waitForStream(l.stream, ctx, "the staged copies of a failed op");
    abandoned_ = false;
  }
  // Per slot: a packed piece out and one in, half a slot each.
  const size_t need = scratch ? static_cast<size_t>(layout.slots) * scratchHalf(layout) * 2 : 0;
  scratch_ = need ? packing_.reserve(need) : nullptr;
  // Both lanes count fp16 overflows (packs out, roundings in): zero the
  // count before either starts.
  SMDCCL_CUDA_CHECK(cudaMemsetAsync(overflowsDev_, 0, sizeof(unsigned long long), opStream));
  followStream();
}

void CudaStageDevice::followStream() {
  CallInFlight call("ordering the staged copies after the op's stream (cudaStreamWaitEvent)");
  // A wait takes the event as recorded at the call: one event serves every mark.
  SMDCCL_CUDA_CHECK(cudaEventRecord(opMark_, opStream_));
  for (Lane& l : lanes_) SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(l.stream, opMark_, 0));
}

void CudaStageDevice::inJoinsOut() {
  SMDCCL_CUDA_CHECK(cudaEventRecord(laneMark_, lanes_[1].stream));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(lanes_[0].stream, laneMark_, 0));
}

void CudaStageDevice::joinStream() {
  CallInFlight call("ordering the op's stream after the staged copies (cudaStreamWaitEvent)");
  // The in lane joins the out lane, which the op's stream then waits for.
  inJoinsOut();
  SMDCCL_CUDA_CHECK(cudaEventRecord(laneMark_, lanes_[0].stream));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(opStream_, laneMark_, 0));
}

void CudaStageDevice::queueEnd() {
  inJoinsOut();
  SMDCCL_CUDA_CHECK(cudaMemcpyAsync(overflowsHost_, overflowsDev_, sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, lanes_[0].stream));
  SMDCCL_CUDA_CHECK(cudaEventRecord(counted_, lanes_[0].stream));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(opStream_, counted_, 0));
}

void CudaStageDevice::finish() {
  waitForEvent(counted_, *ctx_, "the fp16 overflow count of the staged copies");
  tlsFp16Overflows += *overflowsHost_;
}

void CudaStageDevice::fail() noexcept {
  try {
    joinStream();
  } catch (...) {  // the op has failed already; its error is the one that counts
  }
}

uint64_t CudaStageDevice::record(Lane& l) {
  uint64_t seq = ++l.issued;
  if (seq > kEvents && l.completed < seq - kEvents) {
    // The event is about to be reused for a newer copy: the older one must
    // have run first (in stream order, so all before it too).
    waitForEvent(l.events[seq % kEvents], *ctx_, "an earlier staged copy");
    l.completed = seq - kEvents;
  }
  SMDCCL_CUDA_CHECK(cudaEventRecord(l.events[seq % kEvents], l.stream));
  return seq;
}

bool CudaStageDevice::eventDone(Lane& l, uint64_t seq) {
  if (seq <= l.completed) return true;
  // Not yet reused: record() waits for a copy before reusing its event.
  cudaError_t e = queried(cudaEventQuery(l.events[seq % kEvents]));
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) throwCudaError(e, "cudaEventQuery (a staged copy)");
  l.completed = seq;
  return true;
}

void CudaStageDevice::queue(int lane, uint64_t number, const Copy& c) {
  Lane& l = lanes_[lane];
  if (lane == 0) queueOut(l.stream, c);
  else queueIn(l.stream, c);
  l.eventOf[number] = record(l);
}

bool CudaStageDevice::ran(int lane, uint64_t number) {
  Lane& l = lanes_[lane];
  auto it = l.eventOf.find(number);
  if (it == l.eventOf.end()) return true;  // seen done (the lane runs in order)
  if (!eventDone(l, it->second)) return false;
  l.eventOf.erase(l.eventOf.begin(), std::next(it));
  return true;
}

void CudaStageDevice::abandon() { abandoned_ = true; }

size_t CudaStageDevice::slotIndex(const void* slot) const {
  size_t at = static_cast<size_t>(static_cast<const char*>(slot) - slots_);
  return (at / layout_.slotBytes) % static_cast<size_t>(layout_.slots);
}

size_t CudaStageDevice::scratchHalf(const SlotLayout& layout) {
  // Half a slot, rounded up to 16 bytes: every piece starts aligned for the
  // pack and unpack kernels' 16-byte vectors (a slot of each * 4 * P bytes,
  // each * P odd, would put the in lane's half off by 8 and send its unpack
  // element by element).
  return (layout.slotBytes / 2 + 15) / 16 * 16;
}

char* CudaStageDevice::scratch(int lane, size_t slot) const {
  // Each holds a packed piece: half a slot.
  return scratch_ + (slot * 2 + static_cast<size_t>(lane)) * scratchHalf(layout_);
}

void CudaStageDevice::queueOut(cudaStream_t s, const Copy& c) {
  CallInFlight call("queueing a staged copy out (packToWire, cudaMemcpyAsync)");
  const DType dt = c.how.dt;
  const Wire wire = c.how.wire;
  if (c.how.int8) {
    char* out = scratch(0, slotIndex(c.slot));
    SMDCCL_CUDA_CHECK(cuda::quantizeInt8(out, reinterpret_cast<const float*>(c.dev), c.count, s));
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(c.slot, out, int8Bytes(c.count), cudaMemcpyDeviceToHost, s));
  } else if (packed(dt, wire)) {
    char* out = scratch(0, slotIndex(c.slot));
    SMDCCL_CUDA_CHECK(cuda::packToWire(out, reinterpret_cast<const float*>(c.dev), c.count,
                                       {wire, wire == Wire::F16 ? overflowsDev_ : nullptr}, s));
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(c.slot, out, c.count * 2, cudaMemcpyDeviceToHost, s));
  } else if (c.count) {
    SMDCCL_CUDA_CHECK(
        cudaMemcpyAsync(c.slot, c.dev, c.count * elementSize(dt), cudaMemcpyDeviceToHost, s));
  }
}

void CudaStageDevice::queueIn(cudaStream_t s, const Copy& c) {
  CallInFlight call("queueing a staged copy in (cudaMemcpyAsync, unpack kernel)");
  const DType dt = c.how.dt;
  const Wire wire = c.how.wire;
  if (c.how.int8) {
    char* in = scratch(1, slotIndex(c.slot));
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(in, c.slot, int8Bytes(c.count), cudaMemcpyHostToDevice, s));
    SMDCCL_CUDA_CHECK(cuda::dequantizeInt8(reinterpret_cast<float*>(c.dev), in, c.count, s));
    return;
  }
  if (!packed(dt, wire)) {
    if (c.count)
      SMDCCL_CUDA_CHECK(
          cudaMemcpyAsync(c.dev, c.slot, c.count * elementSize(dt), cudaMemcpyHostToDevice, s));
    return;
  }
  char* in = scratch(1, slotIndex(c.slot));
  SMDCCL_CUDA_CHECK(cudaMemcpyAsync(in, c.slot, c.count * 2, cudaMemcpyHostToDevice, s));
  SMDCCL_CUDA_CHECK(cuda::unpackFromWire(reinterpret_cast<float*>(c.dev), in, c.count, wire, s));
}

}  // namespace smdccl
