// DeviceOps for CUDA tensors: the internal stream, the stream-ordered
// completion mark, host staging of the collectives that run on the host,
// and the GPU allreduce (see device_op.h for the life of an op).
// c10/cuda only: ATen/cuda headers pull in cuBLAS/cuSPARSE headers that a
// toolkit without those libraries (CI's nvcc-only install) lacks.
#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "algorithms/cuda/gpu_collectives.h"
#include "backend/device_op.h"
#include "backend/tensor_checks.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"

namespace smdccl {

namespace {

// A stream of the group's own, at the device's highest priority. Not one of
// torch's pool streams: torch.cuda.Stream() hands those out too, and the
// host waits on this stream would then also wait for the user's work.
cudaStream_t createInternalStream(int dev) {
  c10::cuda::CUDAGuard guard(dev);
  int least = 0, greatest = 0;
  SMDCCL_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t s = nullptr;
  SMDCCL_CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
  return s;
}

// Raises a ValueError when the caller's current stream is capturing a CUDA
// graph: the collectives are driven from the host, step by step, which a
// graph cannot replay (and querying a capturing stream breaks the capture).
void checkNotCapturing(int dev, const char* op) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  SMDCCL_CUDA_CHECK(cudaStreamIsCapturing(c10::cuda::getCurrentCUDAStream(dev).stream(), &status));
  TORCH_CHECK_VALUE(status == cudaStreamCaptureStatusNone, "smdccl: ", op,
                    ": the current CUDA stream is capturing a CUDA graph; smdccl's CUDA "
                    "collectives are driven from the host and cannot be captured: call them "
                    "outside the graph");
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
        raw(createInternalStream(dev)),
        stream(c10::cuda::getStreamFromExternal(raw, static_cast<c10::DeviceIndex>(dev))) {
    gpu = std::make_unique<GpuContext>(dev, raw, store, GpuTuning::fromEnv());
  }
  ~CudaState() {
    gpu.reset();  // waits for the stream first
    cudaStreamDestroy(raw);
  }
  CudaState(const CudaState&) = delete;
  CudaState& operator=(const CudaState&) = delete;
};

// A CUDA event (timing off) on device `dev`, destroyed with it.
struct GpuEvent {
  cudaEvent_t event = nullptr;
  explicit GpuEvent(int dev) {
    c10::cuda::CUDAGuard guard(dev);
    SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  }
  ~GpuEvent() {
    if (event) cudaEventDestroy(event);
  }
  GpuEvent(const GpuEvent&) = delete;
  GpuEvent& operator=(const GpuEvent&) = delete;
  // Marks the end of what is queued on device `dev`'s current stream (the
  // caller's) now.
  void recordOnCurrentStream(int dev) {
    SMDCCL_CUDA_CHECK(cudaEventRecord(event, c10::cuda::getCurrentCUDAStream(dev).stream()));
  }
};

// An uninitialized pinned host tensor of `dev`'s shape and dtype.
at::Tensor pinnedHostLike(const at::Tensor& dev) {
  return at::empty(dev.sizes(), dev.options().device(at::kCPU).pinned_memory(true));
}

// When an op's GPU work is all queued on the internal stream: an event
// recorded right behind it. Shared by the op (records it) and its Work
// (waits for it).
struct OpEnd : GpuEvent {
  std::atomic<bool> recorded{false};
  explicit OpEnd(int dev) : GpuEvent(dev) {}
};

// Work.wait() on CUDA tensors. The caller's stream must not wait for GPU
// work that is not queued yet: a stream blocked on a future submission can
// share a hardware queue with the internal stream and block it (seen on an
// H100 with a front-end wait and with a spinning kernel alike: the
// collective never finished). So the host waits until the progress thread
// has queued the op's GPU work, then the caller's stream waits for the
// event behind it. The collectives here drive their steps from the host, so
// that host wait lasts about as long as the collective.
class CudaCompletion : public DeviceCompletion {
 public:
  CudaCompletion(std::shared_ptr<CudaState> s, std::shared_ptr<OpEnd> end, uint64_t seq,
                 uint64_t timeoutNs)
      : s_(std::move(s)), end_(std::move(end)), seq_(seq), timeoutNs_(timeoutNs) {}
  bool done() const override {
    return end_->recorded.load(std::memory_order_acquire) && cudaEventQuery(end_->event) == cudaSuccess;
  }
  void blockCurrentStream(std::chrono::milliseconds timeout) override {
    using Clock = std::chrono::steady_clock;
    auto start = Clock::now();
    // The op has its own deadline and the progress thread records the
    // event also when it fails: this limit only guards against that thread
    // being gone.
    auto limit = timeout.count() > 0 ? std::chrono::nanoseconds(timeout)
                                     : std::chrono::nanoseconds(timeoutNs_);
    auto deadline = start + limit;
    while (!end_->recorded.load(std::memory_order_acquire)) {
      if (Clock::now() >= deadline)
        C10_THROW_ERROR(DistBackendError,
                        strCat("smdccl: collective #", seq_, " was not queued on the GPU within ",
                               std::chrono::duration_cast<std::chrono::milliseconds>(limit).count(),
                               " ms given to wait()"));
      if (Clock::now() - start < std::chrono::microseconds(200)) std::this_thread::yield();
      else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    c10::cuda::CUDAGuard guard(s_->device);
    cudaStream_t cur = c10::cuda::getCurrentCUDAStream(s_->device).stream();
    cudaError_t e = cudaStreamWaitEvent(cur, end_->event, 0);
    TORCH_CHECK(e == cudaSuccess, "smdccl: could not order the current stream after collective #",
                seq_, ": ", cudaGetErrorString(e));
  }
  c10::Device device() const override { return c10::Device(c10::kCUDA, s_->device); }
  c10::Stream stream() const override { return s_->stream; }

 private:
  std::shared_ptr<CudaState> s_;
  std::shared_ptr<OpEnd> end_;
  uint64_t seq_;
  uint64_t timeoutNs_;
};

class CudaOp : public DeviceOp {
 public:
  CudaOp(std::shared_ptr<CudaState> s, uint64_t timeoutNs)
      : s_(std::move(s)),
        end_(std::make_shared<OpEnd>(s_->device)),
        timeoutNs_(timeoutNs),
        ready_(s_->device) {
    // Ordered after what the caller queued on its current stream.
    c10::cuda::CUDAGuard guard(s_->device);
    ready_.recordOnCurrentStream(s_->device);
  }
  c10::Stream stream() const override { return s_->stream; }

  at::Tensor host(const at::Tensor& dev, bool in, bool out) override {
    at::Tensor h = pinnedHostLike(dev);
    if (in) copyIn_.push_back({dev, h});
    if (out) copyOut_.push_back({dev, h});
    return h;
  }

  void prepare(const OpContext& ctx) override {
    SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(s_->stream.stream(), ready_.event, 0));
    if (copyIn_.empty()) return;
    c10::cuda::CUDAStreamGuard guard(s_->stream);
    for (auto& [dev, h] : copyIn_) h.copy_(dev, /*non_blocking=*/true);
    waitForStream(s_->stream.stream(), ctx, "copy to host memory");
  }

  void finishBody(const OpContext& ctx) override {
    if (copyOut_.empty()) return;
    c10::cuda::CUDAStreamGuard guard(s_->stream);
    for (auto& [dev, h] : copyOut_) dev.copy_(h, /*non_blocking=*/true);
    // The pinned copies are freed with this op: the copies must be done.
    waitForStream(s_->stream.stream(), ctx, "copy back from host memory");
  }

  void signal(uint64_t) noexcept override {
    // Also after a failure: nothing may wait for it forever (the event then
    // marks whatever reached the stream).
    cudaEventRecord(end_->event, s_->stream.stream());
    end_->recorded.store(true, std::memory_order_release);
  }

  void allreduce(Comm& c, char* dev, size_t count, DType dt, RedOp op, const Tuning& t) override {
    gpuAllreduce(c, *s_->gpu, dev, count, dt, op, t);
  }

  void reduceScatter(Comm& c, const char* in, char* out, size_t each, DType dt, RedOp op,
                     const Tuning& t) override {
    gpuReduceScatter(c, *s_->gpu, in, out, each, dt, op, t);
  }

  void allgather(Comm& c, const char* in, char* out, size_t eachBytes, const Tuning& t) override {
    gpuAllgather(c, *s_->gpu, in, out, eachBytes, t);
  }

  std::shared_ptr<DeviceCompletion> completion(uint64_t seq) override {
    return std::make_shared<CudaCompletion>(s_, end_, seq, timeoutNs_);
  }

 private:
  std::shared_ptr<CudaState> s_;
  std::shared_ptr<OpEnd> end_;
  uint64_t timeoutNs_;
  GpuEvent ready_;
  std::vector<std::pair<at::Tensor, at::Tensor>> copyIn_, copyOut_;  // (device, pinned host)
};

class CudaDeviceOps : public DeviceOps {
 public:
  CudaDeviceOps(KVStore& store, std::function<std::chrono::milliseconds()> timeout)
      : store_(store), timeout_(std::move(timeout)) {}

  std::shared_ptr<DeviceOp> begin(const std::vector<at::Tensor>& tensors, const char* op) override {
    int device = deviceOf(tensors, op);
    if (device < 0) return nullptr;
    checkNotCapturing(device, op);
    std::shared_ptr<CudaState> s;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!state_) state_ = std::make_shared<CudaState>(device, store_);
      checkGroupDevice(device, op);  // another thread may have created it first
      s = state_;
    }
    // The caching allocator must not hand these blocks to another stream's
    // allocation until the internal stream is done with them.
    for (const auto& t : tensors)
      if (t.defined() && t.numel())
        c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), s->stream);
    uint64_t ns = static_cast<uint64_t>(timeout_().count()) * 1000000ull;
    return std::make_shared<CudaOp>(std::move(s), ns);
  }

  int deviceOf(const std::vector<at::Tensor>& tensors, const char* op) override {
    int device = -1;
    bool anyCpu = false;
    for (const auto& t : tensors) {
      if (!t.defined()) continue;
      if (t.is_cuda()) {
        TORCH_CHECK_VALUE(device < 0 || device == t.get_device(), "smdccl: ", op,
                          ": tensors on cuda:", device, " and cuda:", t.get_device(),
                          "; one call's tensors must be on one device");
        device = t.get_device();
      } else {
        anyCpu = true;
      }
    }
    if (device < 0) return -1;
    TORCH_CHECK_VALUE(!anyCpu, "smdccl: ", op, ": some tensors are on cuda:", device,
                      " and some on the CPU; one call's tensors must be on one device");
    std::lock_guard<std::mutex> lock(mu_);
    checkGroupDevice(device, op);
    return device;
  }

  HostCopy hostCopyForSend(const at::Tensor& dev) override {
    int d = dev.get_device();
    c10::cuda::CUDAGuard guard(d);
    checkNotCapturing(d, "send");
    at::Tensor h = pinnedHostLike(dev);
    // On the caller's current stream, after its queued work; the caller
    // goes on at once (as with ProcessGroupNCCL's send), the send thread
    // waits for the copy.
    h.copy_(dev, /*non_blocking=*/true);
    auto copied = std::make_shared<GpuEvent>(d);
    copied->recordOnCurrentStream(d);
    return {h, [copied](Deadline deadline) {
              waitForEvent(copied->event, deadline, "the copy of a CUDA send into host memory");
            }};
  }

  HostLanding hostForRecv(const at::Tensor& dev) override {
    int d = dev.get_device();
    c10::cuda::CUDAGuard guard(d);
    checkNotCapturing(d, "recv");
    at::Tensor h = pinnedHostLike(dev);
    // What the caller queued before the recv may still use `dev`: the copy
    // into it waits for that (as ProcessGroupNCCL's recv does), not for
    // what the caller queues later.
    auto callerQueued = std::make_shared<GpuEvent>(d);
    callerQueued->recordOnCurrentStream(d);
    // A stream of its own: on the legacy default stream the copy would wait
    // for every other blocking stream of the device. The allocator keeps
    // `dev`'s block for it even if the caller drops `dev` early.
    c10::cuda::CUDAStream copyStream = c10::cuda::getStreamFromPool(false, d);
    c10::cuda::CUDACachingAllocator::recordStream(dev.storage().data_ptr(), copyStream);
    return {h, [dev, h, callerQueued, copyStream](Deadline deadline) {
              c10::cuda::CUDAStreamGuard streamGuard(copyStream);
              SMDCCL_CUDA_CHECK(cudaStreamWaitEvent(copyStream.stream(), callerQueued->event, 0));
              at::Tensor target = dev;  // the lambda's captures are const
              target.copy_(h, /*non_blocking=*/true);
              GpuEvent copied(copyStream.device_index());
              SMDCCL_CUDA_CHECK(cudaEventRecord(copied.event, copyStream.stream()));
              waitForEvent(copied.event, deadline, "the copy of a CUDA recv into the tensor");
            }};
  }

 private:
  // With mu_ held: a group's CUDA collectives all run on its first one's GPU.
  void checkGroupDevice(int device, const char* op) const {
    TORCH_CHECK_VALUE(!state_ || state_->device == device, "smdccl: ", op,
                      ": this group runs on cuda:", state_ ? state_->device : -1,
                      " (its first CUDA collective was there), got a tensor on cuda:", device,
                      "; use one GPU per rank and group, like NCCL");
  }

  KVStore& store_;
  std::function<std::chrono::milliseconds()> timeout_;
  std::mutex mu_;
  std::shared_ptr<CudaState> state_;
};

}  // namespace

std::unique_ptr<DeviceOps> makeDeviceOps(KVStore& store,
                                         std::function<std::chrono::milliseconds()> timeout) {
  return std::make_unique<CudaDeviceOps>(store, std::move(timeout));
}

}  // namespace smdccl
