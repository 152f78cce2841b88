// DeviceOps for CUDA tensors: the internal stream, the stream-ordered
// completion mark, host staging of the collectives that run on the host,
// and the GPU allreduce (see device_op.h for the life of an op).
// c10/cuda only: ATen/cuda headers pull in cuBLAS/cuSPARSE headers that a
// toolkit without those libraries (CI's nvcc-only install) lacks.
#include <cstdint>
#include <ATen/ATen.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

#include "algorithms/cuda/gpu_collectives.h"
#include "algorithms/gpu_paths.h"
#include "backend/arg_checks.h"
#include "backend/cuda/cuda_completion.h"
#include "backend/cuda/internal_streams.h"
#include "backend/device_op.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"
#include "transport/nccl_library.h"
#include "common/calls_in_flight.h"

namespace smdccl {

namespace {

// Raises a ValueError when the caller's current stream is capturing a CUDA
// graph: the collectives are driven from the host, step by step, which a
// graph cannot replay (and querying a capturing stream breaks the capture).
void checkNotCapturing(int dev, const char* opName) {
  CaptureSafeScope captureSafe;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SMDCCL_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(dev).stream(), &status));
  TORCH_CHECK_VALUE(status == cudaStreamCaptureStatusNone, "smdccl: ", opName,
                    ": the current CUDA stream is capturing a CUDA graph; smdccl's CUDA "
                    "collectives are driven from the host and cannot be captured: call them "
                    "outside the graph");
}

// Whether NCCL has the call's dtype and reduction (torch's codes; a call
// without one has none to lack).
bool ncclHasTypes(const OpSignature& sig) {
  using ::c10d::ReduceOp;
  if (sig.redop == ReduceOp::BAND || sig.redop == ReduceOp::BOR || sig.redop == ReduceOp::BXOR)
    return false;
  if (sig.dtype < 0) return true;
  int unused = 0;
  try {
    return NcclLibrary::dataType(toDType(static_cast<at::ScalarType>(sig.dtype), "collective"),
                                 &unused);
  } catch (const std::exception&) {  // a dtype smdccl carries as bytes only
    return false;
  }
}

// One group's GPU state: created at its first CUDA collective, on the
// device of that collective's tensors.
struct CudaState {
  int device;
  cudaStream_t raw;
  c10::cuda::CUDAStream stream;
  std::unique_ptr<GpuContext> gpu;
  CudaState(int dev, KVStore& store)
      : device(dev),
        raw(InternalStreams::take(dev)),
        stream(c10::cuda::getStreamFromExternal(raw, static_cast<c10::DeviceIndex>(dev))) {
    // On the tensors' device, whatever the caller's current one: the
    // kernels are preloaded into its context (not another GPU's, which
    // this would also create).
    c10::cuda::CUDAGuard guard(dev);
    // Out of device memory, smdccl's own buffers first take back what
    // torch's caching allocator holds idle, then retry once. While another
    // thread captures a CUDA graph the allocator refuses (it asserts): the
    // retry then fails and names the out-of-memory, not the assert.
    gpu = std::make_unique<GpuContext>(dev, raw, store, GpuTuning::fromEnv(), [] {
      try {
        c10::cuda::CUDACachingAllocator::emptyCache();
      } catch (const c10::Error&) {}
    });
  }
  ~CudaState() {
    c10::cuda::CUDAGuard guard(device);
    CaptureSafeScope captureSafe;
    gpu.reset();  // waits (bounded) for the stream first
    // A stream that never drained (see ~GpuContext) is not handed on.
    if (queried(cudaStreamQuery(raw)) == cudaSuccess) InternalStreams::giveBack(device, raw);
  }
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;
};

// An uninitialized pinned host tensor of `dev`'s shape and dtype.
at::Tensor pinnedHostLike(const at::Tensor& dev) {
  return at::empty(dev.sizes(), dev.options().device(at::kCPU).pinned_memory(true));
}

class CudaOp : public DeviceOp {
 public:
  explicit CudaOp(std::shared_ptr<CudaState> s)
      : s_(std::move(s)), end_(std::make_shared<OpEnd>(s_->device)), ready_(s_->device) {
    // Ordered after what the caller queued on its current stream.
    c10::cuda::CUDAGuard guard(s_->device);
    CaptureSafeScope captureSafe;
    ready_.recordOnCurrentStream(s_->device);
  }
  ~CudaOp() override {
    // The pinned copies go back to torch's host allocator (event queries).
    CaptureSafeScope captureSafe;
    copyIn_.clear();
    copyOut_.clear();
  }
  c10::Stream stream() const override { return s_->stream; }

  at::Tensor host(const at::Tensor& dev, bool in, bool out) override {
    at::Tensor h = pinnedHostLike(dev);
    if (in) copyIn_.push_back({dev, h});
    if (out) copyOut_.push_back({dev, h});
    return h;
  }

  void prepare(const OpContext& ctx) override {
    end_->startedNs.store(steadyNowNs(), std::memory_order_release);
    s_->gpu->joinOpFailure(ctx.seq, end_->failure);
    CaptureSafeScope captureSafe;
    SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(s_->stream.stream(), ready_.event, 0));
    if (copyIn_.empty()) return;
    c10::cuda::CUDAStreamGuard guard(s_->stream);
    for (auto& [dev, h] : copyIn_) {
      h.copy_(dev, /*non_blocking=*/true);
      s_->gpu->countCopies(h.nbytes(), 0);
    }
    copiedIn_.emplace(s_->device);
    SMDCCL_CUDA_CHECK(cudaEventRecord(copiedIn_->event, s_->stream.stream()));
  }

  bool hostStaged() const override { return !copyIn_.empty() || !copyOut_.empty(); }

  bool hostDriven(const Hierarchy& h, const OpSignature& sig) const override {
    // Only NCCL inside one node is queued without the host waiting for it
    // (the IPC steps meet at host barriers, the staged steps are the
    // host's): a dtype or reduction NCCL lacks takes another path.
    GpuFacts f = groupFacts(h, s_->gpu->tuning());
    f.ncclTypes = ncclHasTypes(sig);
    f.ncclChosen = s_->gpu->ncclChosen();
    return hostStaged() || !ncclQueuesWhole(f);
  }

  void beforeBody(const OpContext& ctx) override { awaitInputs(ctx); }

  void awaitInputs(const OpContext& ctx) override {
    CaptureSafeScope captureSafe;
    if (copiedIn_) waitForEvent(copiedIn_->event, ctx, "copy to host memory");
  }

  void finishBody(const OpContext& ctx) override {
    if (copyOut_.empty()) return;
    CaptureSafeScope captureSafe;
    c10::cuda::CUDAStreamGuard guard(s_->stream);
    for (auto& [dev, h] : copyOut_) {
      dev.copy_(h, /*non_blocking=*/true);
      s_->gpu->countCopies(0, h.nbytes());
    }
    // The pinned copies are freed with this op: the copies must be done.
    waitForStream(s_->stream.stream(), ctx, "copy back from host memory");
  }

  void signal(uint64_t) noexcept override {
    // Also after a failure: nothing may wait for it forever (the event then
    // marks whatever reached the stream). On the progress thread this
    // also switches the capture mode for the future's completion after it.
    CaptureSafeScope captureSafe;
    markEnd();
  }

  void allreduce(Comm& c, const CollectiveArgs& a, const Tuning& t) override {
    CaptureSafeScope captureSafe;
    gpuAllreduce(c, *s_->gpu, a, t);
  }

  void reduce(Comm& c, const CollectiveArgs& a, const Tuning& t) override {
    CaptureSafeScope captureSafe;
    gpuReduce(c, *s_->gpu, a, t);
  }

  void reduceScatter(Comm& c, const BlockReduction& r, const Tuning& t) override {
    CaptureSafeScope captureSafe;
    gpuReduceScatter(c, *s_->gpu, r, t);
  }

  void allgather(Comm& c, const BlockGather& g, const Tuning& t) override {
    CaptureSafeScope captureSafe;
    gpuAllgather(c, *s_->gpu, g, t);
  }

  void broadcast(Comm& c, const CollectiveArgs& a, const Tuning& t) override {
    CaptureSafeScope captureSafe;
    gpuBroadcast(c, *s_->gpu, a, t);
  }

  std::shared_ptr<DeviceCompletion> completion(std::function<std::string()> what,
                                               std::chrono::milliseconds timeout) override {
    return std::make_shared<CudaCompletion>(s_->device, s_->stream, end_, std::move(what), timeout);
  }

 private:
  std::shared_ptr<CudaState> s_;
  std::shared_ptr<OpEnd> end_;
  GpuEvent ready_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copyIn_, copyOut_;  // (device, pinned host)
  std::optional<GpuEvent> copiedIn_;                                 // behind the copies in

  // Records the op's end behind what its stream has queued.
  void markEnd() noexcept {
    CallInFlight call("cudaEventRecord of the op's end");
    end_->recordError = cudaEventRecord(end_->event, s_->stream.stream());
    end_->recorded.store(true, std::memory_order_release);
  }
};

class CudaDeviceOps : public DeviceOps {
 public:
  CudaDeviceOps(KVStore& store, std::function<std::chrono::milliseconds()> timeout)
      : store_(store), timeout_(std::move(timeout)) {}

  std::shared_ptr<DeviceOp> begin(const std::vector<at::Tensor>& tensors,
                                  const char* opName) override {
    int device = deviceOf(tensors, opName);
    if (device < 0) return nullptr;
    checkNotCapturing(device, opName);
    CaptureSafeScope captureSafe;
    std::shared_ptr<CudaState> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!state_) {
        state_ = std::make_shared<CudaState>(device, store_);
        state_->gpu->onDeviceFailure(deviceFailed_);
      }
      checkGroupDevice(device, opName);  // another thread may have created it first
      s = state_;
    }
    // The caching allocator must not hand these blocks to another stream's
    // allocation until the internal stream is done with them.
    for (const auto& t : tensors)
      if (t.defined() && t.numel())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s->stream);
    return std::make_shared<CudaOp>(std::move(s));
  }

  int deviceOf(const std::vector<at::Tensor>& tensors, const char* opName) override {
    int device = -1;
    bool anyCpu = false;
    for (const auto& t : tensors) {
      if (!t.defined()) continue;
      if (t.is_cuda()) {
        TORCH_CHECK_VALUE(device < 0 || device == t.get_device(), "smdccl: ", opName,
                          ": tensors on cuda:", device, " and cuda:", t.get_device(),
                          "; one call's tensors must be on one device");
        device = t.get_device();
      } else {
        anyCpu = true;
      }
    }
    if (device < 0) return -1;
    TORCH_CHECK_VALUE(!anyCpu, "smdccl: ", opName, ": some tensors are on cuda:", device,
                      " and some on the CPU; one call's tensors must be on one device");
    std::lock_guard<std::mutex> lock(mu_);
    checkGroupDevice(device, opName);
    return device;
  }

  HostCopy hostCopyForSend(const at::Tensor& dev) override {
    int d = dev.get_device();
    c10::cuda::CUDAGuard guard(d);
    checkNotCapturing(d, "send");
    CaptureSafeScope captureSafe;
    at::Tensor h = pinnedHostLike(dev);
    // On the caller's current stream, after its queued work; the caller
    // goes on at once (as with ProcessGroupNCCL's send), the send/recv loop
    // polls for the copy's end.
    h.copy_(dev, /*non_blocking=*/true);
    auto copied = std::make_shared<GpuEvent>(d);
    copied->recordOnCurrentStream(d);
    // The loop's thread runs this: it has no current device of its own.
    return {h, [copied]() -> bool {
              c10::cuda::CUDAGuard guard(copied->device);
              CaptureSafeScope captureSafe;
              cudaError_t e = queried(cudaEventQuery(copied->event));
              if (e == cudaErrorNotReady) return false;
              if (e != cudaSuccess) throwCudaError(e, "the copy of a CUDA send into host memory");
              return true;
            }};
  }

  HostLanding hostForRecv(const at::Tensor& dev) override {
    int d = dev.get_device();
    c10::cuda::CUDAGuard guard(d);
    checkNotCapturing(d, "recv");
    CaptureSafeScope captureSafe;
    at::Tensor h = pinnedHostLike(dev);
    // What the caller queued before the recv may still use `dev`: the copy
    // into it waits for that (as ProcessGroupNCCL's recv does), not for
    // what the caller queues later.
    auto callerQueued = std::make_shared<GpuEvent>(d);
    callerQueued->recordOnCurrentStream(d);
    // The device's receive stream: not the legacy default stream (the copy
    // would wait for every other blocking stream of the device) nor one of
    // torch's pool streams (the copy would queue behind user work that
    // torch.cuda.Stream() put there). The allocator keeps `dev`'s block for
    // the copy even if the caller drops `dev` early.
    c10::cuda::CUDAStream copyStream = receiveStream(d);
    c10::cuda::CUDACachingAllocator::recordStream(dev.storage().data_ptr(), copyStream);
    auto end = std::make_shared<OpEnd>(d);
    end->startedNs.store(steadyNowNs(), std::memory_order_release);
    auto completion = std::make_shared<CudaCompletion>(
        d, copyStream, end, [] { return std::string("recv"); }, timeout_());
    // Queues the copy and marks its end; the host never waits for the GPU
    // here (the caller may be the one that landed it: an early message).
    auto land = [dev, h, callerQueued, copyStream, end](bool arrived) {
      // Whatever happens, a wait() on the recv must not wait for ever.
      struct MarkRecorded {
        OpEnd& e;
        ~MarkRecorded() { e.recorded.store(true, std::memory_order_release); }
      } mark{*end};
      if (!arrived) return;
      c10::cuda::CUDAStreamGuard streamGuard(copyStream);
      CaptureSafeScope captureSafe;
      at::AutoDispatchBelowADInplaceOrView belowAutograd;  // as runChecksAndBody's
      cudaError_t e = cudaStreamWaitEvent(copyStream.stream(), callerQueued->event, 0);
      if (e == cudaSuccess) {
        at::Tensor target = dev;  // the lambda's captures are const
        target.copy_(h, /*non_blocking=*/true);
        e = cudaEventRecord(end->event, copyStream.stream());
      }
      end->recordError = e;
      if (e != cudaSuccess) throwCudaError(e, "queueing the copy of a CUDA recv into its tensor");
    };
    return {h, std::move(land), std::move(completion)};
  }

 private:
  // With mu_ held: a group's CUDA collectives all run on its first one's GPU.
  void checkGroupDevice(int device, const char* opName) const {
    TORCH_CHECK_VALUE(!state_ || state_->device == device, "smdccl: ", opName,
                      ": this group runs on cuda:", state_ ? state_->device : -1,
                      " (its first CUDA collective was there), got a tensor on cuda:", device,
                      "; use one GPU per rank and group, like NCCL");
  }

  // A few per device for the process, taken in turn (a copy waits for its
  // caller's queued work: one stream would hold every later receive behind
  // it), never destroyed (tensors are recordStream()ed on them, as on the
  // internal streams).
  static c10::cuda::CUDAStream receiveStream(int dev) {
    constexpr size_t kPerDevice = 4;
    static auto* mu = new std::mutex;
    static auto* streams = new std::map<int, std::pair<std::vector<cudaStream_t>, size_t>>;
    std::lock_guard<std::mutex> lock(*mu);
    auto& [pool, next] = (*streams)[dev];
    if (pool.size() < kPerDevice) pool.push_back(InternalStreams::take(dev));
    cudaStream_t s = pool[next++ % pool.size()];
    return c10::cuda::getStreamFromExternal(s, static_cast<c10::DeviceIndex>(dev));
  }

  KVStore& store_;
  std::function<std::chrono::milliseconds()> timeout_;
  mutable std::mutex mu_;
  std::shared_ptr<CudaState> state_;
  std::function<void(const std::string&)> deviceFailed_;

 public:
  void onDeviceFailure(std::function<void(const std::string&)> handler) override {
    std::lock_guard<std::mutex> lock(mu_);
    deviceFailed_ = std::move(handler);
    if (state_) state_->gpu->onDeviceFailure(deviceFailed_);
  }
  void abort(const std::string& cause) override {
    std::shared_ptr<CudaState> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      s = state_;
    }
    if (s) s->gpu->abort(cause);
  }
  CopiedBytes copiedBytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_) return {};
    return {state_->gpu->bytesToHost(), state_->gpu->bytesFromHost()};
  }
  size_t pinnedStagingBytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    if (!state_) return 0;
    return state_->gpu->staging().capacity() + state_->gpu->staging().retiredBytes();
  }
};

}  // namespace

std::unique_ptr<DeviceOps> makeDeviceOps(KVStore& store,
                                         std::function<std::chrono::milliseconds()> timeout) {
  return std::make_unique<CudaDeviceOps>(store, std::move(timeout));
}

}  // namespace smdccl
