#include "algorithms/cuda/cuda_stage_device.h"

#include "common/error.h"
#include "kernels/cpu/reduce.h"
#include "kernels/cuda/kernels.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"
#include "transport/cuda/ipc_space.h"
#include <cstdint>

namespace smdccl {

CudaStageDevice::CudaStageDevice(std::function<void()> freeCached)
    : freeCached_(std::move(freeCached)) {
  for (Lane& l : lanes_) {
    SMDCCL_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
    l.events.resize(kEvents);
    for (cudaEvent_t& e : l.events)
      SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&start_, cudaEventDisableTiming));
  void* p = nullptr;
  SMDCCL_CUDA_CHECK(cudaMalloc(&p, sizeof(unsigned long long)));
  overflowsDev_ = static_cast<unsigned long long*>(p);
  SMDCCL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(unsigned long long), cudaHostAllocPortable));
  overflowsHost_ = static_cast<unsigned long long*>(p);
}

CudaStageDevice::~CudaStageDevice() {
  // Nothing of ours may still run when the scratch goes.
  for (Lane& l : lanes_) {
    if (l.stream) cudaStreamSynchronize(l.stream);
    for (cudaEvent_t e : l.events) cudaEventDestroy(e);
    if (l.stream) cudaStreamDestroy(l.stream);
  }
  if (start_) cudaEventDestroy(start_);
  if (scratch_) cudaFree(scratch_);
  if (overflowsDev_) cudaFree(overflowsDev_);
  if (overflowsHost_) cudaFreeHost(overflowsHost_);
}

void CudaStageDevice::begin(cudaStream_t opStream, char* slots, const StagePlan& plan,
                            const OpContext& ctx) {
  opStream_ = opStream;
  slots_ = slots;
  plan_ = plan;
  ctx_ = &ctx;
  const size_t need = static_cast<size_t>(plan.slots) * (plan.slotBytes / 2 + plan.slotBytes);
  if (need > scratchBytes_) {
    // Only our lanes use the scratch, and they are idle between ops
    // (finish() or abandon() joined them into the op stream, which the
    // caller waited for).
    for (Lane& l : lanes_) waitForStream(l.stream, ctx, "the staged copies of an earlier op");
    if (scratch_) SMDCCL_CUDA_CHECK(cudaFree(scratch_));
    scratch_ = nullptr;
    scratchBytes_ = 0;
    int device = -1;
    (void)cudaGetDevice(&device);
    scratch_ = static_cast<char*>(
        allocateDeviceMemory(need, device, freeCached_, "the staged ring's device scratch",
                             "SMDCCL_CUDA_STAGED_RING=0 stages through host memory without it"));
    scratchBytes_ = need;
  }
  // Both lanes count fp16 overflows (packs out, roundings in): zero the
  // count before either starts.
  SMDCCL_CUDA_CHECK(cudaMemsetAsync(overflowsDev_, 0, sizeof(unsigned long long), opStream));
  SMDCCL_CUDA_CHECK(cudaEventRecord(start_, opStream));
  for (Lane& l : lanes_) SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(l.stream, start_, 0));
}

cudaEvent_t CudaStageDevice::eventOf(Ticket t) const {
  return lanes_[t & 1].events[(t >> 1) % kEvents];
}

void CudaStageDevice::joinInto(cudaStream_t s) {
  // The in lane joins the out lane, which the stream then waits for.
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(lanes_[0].stream, eventOf(record(1)), 0));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(s, eventOf(record(0)), 0));
}

void CudaStageDevice::finish() {
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(lanes_[0].stream, eventOf(record(1)), 0));
  SMDCCL_CUDA_CHECK(cudaMemcpyAsync(overflowsHost_, overflowsDev_, sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, lanes_[0].stream));
  Ticket counted = record(0);
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(opStream_, eventOf(counted), 0));
  waitForEvent(eventOf(counted), *ctx_, "the fp16 overflow count of the staged copies");
  tlsFp16Overflows += *overflowsHost_;
}

void CudaStageDevice::abandon() noexcept {
  try {
    joinInto(opStream_);
  } catch (...) {  // the op has failed already; its error is the one that counts
  }
}

StageDevice::Ticket CudaStageDevice::record(int lane) {
  Lane& l = lanes_[lane];
  uint64_t seq = ++l.issued;
  if (seq > kEvents && l.completed < seq - kEvents) {
    // The event is about to be reused for a newer ticket: the older one's
    // work must have run first (in stream order, so all before it too).
    waitForEvent(l.events[seq % kEvents], *ctx_, "an earlier staged copy");
    l.completed = seq - kEvents;
  }
  SMDCCL_CUDA_CHECK(cudaEventRecord(l.events[seq % kEvents], l.stream));
  return (seq << 1) | static_cast<Ticket>(lane);
}

bool CudaStageDevice::done(Ticket t) {
  Lane& l = lanes_[t & 1];
  uint64_t seq = t >> 1;
  if (seq <= l.completed) return true;
  // Not yet reused: record() waits for a ticket before reusing its event.
  cudaError_t e = queried(cudaEventQuery(l.events[seq % kEvents]));
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) throwCudaError(e, "cudaEventQuery (a staged copy)");
  l.completed = seq;
  return true;
}

size_t CudaStageDevice::slotIndex(const void* slot) const {
  size_t at = static_cast<size_t>(static_cast<const char*>(slot) - slots_);
  return (at / plan_.slotBytes) % static_cast<size_t>(plan_.slots);
}

char* CudaStageDevice::scratch(int lane, size_t slot) const {
  // Out scratch holds a packed piece (half a slot), in scratch a whole one.
  const size_t outBytes = plan_.slotBytes / 2;
  char* base = scratch_ + slot * (outBytes + plan_.slotBytes);
  return lane == 0 ? base : base + outBytes;
}

StageDevice::Ticket CudaStageDevice::queueToHost(void* slot, const char* src, size_t count,
                                                 DType dt, Wire wire) {
  cudaStream_t s = lanes_[0].stream;
  if (packed(dt, wire)) {
    char* out = scratch(0, slotIndex(slot));
    SMDCCL_CUDA_CHECK(cuda::packToWire(out, reinterpret_cast<const float*>(src), count,
                                       {wire, wire == Wire::F16 ? overflowsDev_ : nullptr}, s));
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(slot, out, count * 2, cudaMemcpyDeviceToHost, s));
  } else {
    SMDCCL_CUDA_CHECK(
        cudaMemcpyAsync(slot, src, count * elementSize(dt), cudaMemcpyDeviceToHost, s));
  }
  return record(0);
}

StageDevice::Ticket CudaStageDevice::queueFromHost(char* dst, const void* slot, size_t count,
                                                   const Unpack& how) {
  const DType dt = how.dt;
  const Wire wire = how.wire, roundTo = how.roundTo;
  const bool reduce = how.reduce;
  const RedOp op = how.op;
  cudaStream_t s = lanes_[1].stream;
  const bool is16 = packed(dt, wire);
  const size_t bytes = count * wireElementSize(dt, wire);
  float* f = reinterpret_cast<float*>(dst);
  char* in = scratch(1, slotIndex(slot));
  if (!reduce && !is16) {
    SMDCCL_CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, s));
    return record(1);
  }
  SMDCCL_CUDA_CHECK(cudaMemcpyAsync(in, slot, bytes, cudaMemcpyHostToDevice, s));
  if (!reduce) SMDCCL_CUDA_CHECK(cuda::unpackFromWire(f, in, count, wire, s));
  else if (is16) SMDCCL_CUDA_CHECK(cuda::unpackReduceFromWire(f, in, count, {wire, op}, s));
  else SMDCCL_CUDA_CHECK(cuda::reduce2(dst, dst, in, {count, dt, op}, s));
  if (reduce && dt == DType::F32 && roundTo != Wire::F32) {
    // A final sum: round it to what the wire delivers (the peers hold
    // that), through the scratch, as the host's roundToWire does.
    SMDCCL_CUDA_CHECK(cuda::packToWire(
        in, f, count, {roundTo, roundTo == Wire::F16 ? overflowsDev_ : nullptr}, s));
    SMDCCL_CUDA_CHECK(cuda::unpackFromWire(f, in, count, roundTo, s));
  }
  return record(1);
}

}  // namespace smdccl
