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
  try {  // a failure part way (out of memory) frees what was made: no destructor runs
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
  } catch (...) {
    release();
    throw;
  }
}

CudaStageDevice::~CudaStageDevice() { release(); }

void CudaStageDevice::release() noexcept {
  // Nothing of ours may still run when the scratch goes.
  for (Lane& l : lanes_) {
    if (l.stream) cudaStreamSynchronize(l.stream);
    for (cudaEvent_t e : l.events)
      if (e) cudaEventDestroy(e);
    if (l.stream) cudaStreamDestroy(l.stream);
  }
  for (cudaEvent_t e : {opMark_, laneMark_, counted_})
    if (e) cudaEventDestroy(e);
  if (overflowsDev_) cudaFree(overflowsDev_);
  if (overflowsHost_) cudaFreeHost(overflowsHost_);
}

void CudaStageDevice::run(cudaStream_t opStream, char* slots, const OpContext& ctx,
                          StagedRoundsJob job) {
  begin(opStream, slots, job, ctx);
  try {
    runStagedRounds(ctx, *this, std::move(job), slots);
    queueEnd();
    waitForEvent(counted_, ctx, "the fp16 overflow count of the staged copies");
  } catch (...) {
    abandon();
    joinStream();
    throw;
  }
  tlsFp16Overflows += *overflowsHost_;
}

void CudaStageDevice::begin(cudaStream_t opStream, char* slots, const StagedRoundsJob& job,
                            const OpContext& ctx) {
  opStream_ = opStream;
  slots_ = slots;
  slotBytes_ = job.slotBytes;
  slotCount_ = job.slots;
  ctx_ = &ctx;
  if (abandoned_) {
    // A failed op's copies already queued still run: none may touch the
    // slots or the scratch of this one.
    for (Lane& l : lanes_) waitForStream(l.stream, ctx, "the staged copies of a failed op");
    abandoned_ = false;
  }
  // Per slot: a packed piece out and one in, half a slot each.
  const bool packs = packed(job.dt, job.wire) || job.hasInt8();
  const size_t need = packs ? static_cast<size_t>(slotCount_) * scratchHalf() * 2 : 0;
  scratch_ = need ? packing_.reserve(need) : nullptr;
  CallInFlight call("ordering the staged copies after the op's stream (cudaStreamWaitEvent)");
  // Both lanes count fp16 overflows (packs out, roundings in): zero the
  // count before either starts.
  SMDCCL_CUDA_CHECK(cudaMemsetAsync(overflowsDev_, 0, sizeof(unsigned long long), opStream));
  SMDCCL_CUDA_CHECK(cudaEventRecord(opMark_, opStream_));
  for (Lane& l : lanes_) SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(l.stream, opMark_, 0));
}

void CudaStageDevice::inJoinsOut() {
  SMDCCL_CUDA_CHECK(cudaEventRecord(laneMark_, lanes_[1].stream));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(lanes_[0].stream, laneMark_, 0));
}

void CudaStageDevice::joinStream() noexcept {
  try {
    // The in lane joins the out lane, which the op's stream then waits for.
    inJoinsOut();
    SMDCCL_CUDA_CHECK(cudaEventRecord(laneMark_, lanes_[0].stream));
    SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(opStream_, laneMark_, 0));
  } catch (...) {  // the op has failed already; its error is the one that counts
  }
}

void CudaStageDevice::queueEnd() {
  CallInFlight call("ordering the op's stream after the staged copies (cudaStreamWaitEvent)");
  inJoinsOut();
  SMDCCL_CUDA_CHECK(cudaMemcpyAsync(overflowsHost_, overflowsDev_, sizeof(unsigned long long),
                                    cudaMemcpyDeviceToHost, lanes_[0].stream));
  SMDCCL_CUDA_CHECK(cudaEventRecord(counted_, lanes_[0].stream));
  SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(opStream_, counted_, 0));
}

void CudaStageDevice::record(Lane& l, uint64_t seq) {
  if (seq > kEvents && l.completed < seq - kEvents) {
    // The event is about to be reused for a newer copy: the older one must
    // have run first (in stream order, so all before it too).
    waitForEvent(l.events[seq % kEvents], *ctx_, "an earlier staged copy");
    l.completed = seq - kEvents;
  }
  SMDCCL_CUDA_CHECK(cudaEventRecord(l.events[seq % kEvents], l.stream));
}

bool CudaStageDevice::ran(int lane, uint64_t seq) {
  Lane& l = lanes_[lane];
  if (seq <= l.completed) return true;
  // Not yet reused: record() waits for a copy before reusing its event.
  cudaError_t e = queried(cudaEventQuery(l.events[seq % kEvents]));
  if (e == cudaErrorNotReady) return false;
  if (e != cudaSuccess) throwCudaError(e, "cudaEventQuery (a staged copy)");
  l.completed = seq;
  return true;
}

void CudaStageDevice::abandon() { abandoned_ = true; }

size_t CudaStageDevice::slotIndex(const void* slot) const {
  size_t at = static_cast<size_t>(static_cast<const char*>(slot) - slots_);
  return (at / slotBytes_) % static_cast<size_t>(slotCount_);
}

size_t CudaStageDevice::scratchHalf() const {
  // Half a slot, rounded up to 16 bytes: every piece starts aligned for the
  // pack and unpack kernels' 16-byte vectors (a slot of each * 4 * P bytes,
  // each * P odd, would put the in lane's half off by 8 and send its unpack
  // element by element).
  return (slotBytes_ / 2 + 15) / 16 * 16;
}

char* CudaStageDevice::scratch(int lane, size_t slot) const {
  // Each holds a packed piece: half a slot.
  return scratch_ + (slot * 2 + static_cast<size_t>(lane)) * scratchHalf();
}

void CudaStageDevice::queue(int lane, uint64_t number, const Copy& c) {
  Lane& l = lanes_[lane];
  {  // record() below may wait for the host: not a CUDA call in flight
    CallInFlight call(c.out ? "queueing a staged copy out (pack kernel, cudaMemcpyAsync)"
                            : "queueing a staged copy in (cudaMemcpyAsync, unpack kernel)");
    const cudaStream_t s = l.stream;
    // Cast or quantized: the packed piece passes through this slot's scratch.
    const bool viaScratch = transforms(c.how);
    char* piece = viaScratch ? scratch(lane, slotIndex(c.slot)) : c.dev;
    auto* f = reinterpret_cast<float*>(c.dev);
    if (c.out && c.how.int8) SMDCCL_CUDA_CHECK(cuda::quantizeInt8(piece, f, c.count, s));
    else if (c.out && viaScratch)
      SMDCCL_CUDA_CHECK(cuda::packToWire(
          piece, f, c.count, {c.how.wire, c.how.wire == Wire::F16 ? overflowsDev_ : nullptr}, s));
    if (const size_t bytes = slotBytes(c.count, c.how))
      SMDCCL_CUDA_CHECK(c.out ? cudaMemcpyAsync(c.slot, piece, bytes, cudaMemcpyDeviceToHost, s)
                              : cudaMemcpyAsync(piece, c.slot, bytes, cudaMemcpyHostToDevice, s));
    if (!c.out && c.how.int8) SMDCCL_CUDA_CHECK(cuda::dequantizeInt8(f, piece, c.count, s));
    else if (!c.out && viaScratch)
      SMDCCL_CUDA_CHECK(cuda::unpackFromWire(f, piece, c.count, c.how.wire, s));
  }
  record(l, number);
}

}  // namespace smdccl
