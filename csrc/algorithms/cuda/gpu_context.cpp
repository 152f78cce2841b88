#include "algorithms/cuda/gpu_context.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>

#include "algorithms/collectives.h"
#include "algorithms/cuda/cuda_stage_device.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/sm_cap.h"
#include "algorithms/comm.h"
#include "common/error.h"
#include "common/log.h"
#include "transport/cuda/cuda_check.h"
#include "transport/cuda/gpu_wait.h"
#include "common/calls_in_flight.h"

namespace smdccl {

void GpuContext::agreeOnTuning(Comm& c, const Tuning& t) {
  if (tuningAgreed_ || c.size() == 1) return;
  constexpr size_t kFields = 6;
  static const char* kIntra[] = {"auto", "nccl", "ipc"};
  auto fields = [](const GpuTuning& g) {
    uint64_t intra = 0;
    while (intra < 2 && g.intra != kIntra[intra]) ++intra;
    return std::array<uint64_t, kFields>{g.ipc ? 1u : 0u,         g.ipcBytes,
                                         g.oneShotBytes,          g.stageChunkBytes,
                                         g.streamBarrier ? 1u : 0u, intra};
  };
  // A tiny allgather over the group: it carries this op's header, so a rank
  // that called another op (or passed CPU tensors) is named as such first.
  std::vector<uint64_t> all(static_cast<size_t>(c.size()) * kFields);
  auto mine = fields(tuning_);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<size_t>(c.rank()) * kFields);
  allgather(c, reinterpret_cast<char*>(all.data()), Blocks::equal(c.size(), kFields * 8), t);
  for (int r = 0; r < c.size(); ++r) {
    const uint64_t* f = all.data() + static_cast<size_t>(r) * kFields;
    if (std::equal(mine.begin(), mine.end(), f)) continue;
    GpuTuning theirs;
    theirs.ipc = f[0] != 0;
    theirs.ipcBytes = f[1];
    theirs.oneShotBytes = f[2];
    theirs.stageChunkBytes = f[3];
    theirs.streamBarrier = f[4] != 0;
    theirs.intra = kIntra[std::min<uint64_t>(f[5], 2)];
    throw CommError(
        CommError::Kind::Mismatch,
        strCat("smdccl: ", c.ctx.describe(), ": CUDA settings differ between ranks: rank ", r,
               " has ", theirs.describe(), ", rank ", c.rank(), " has ", tuning_.describe(),
               "; set SMDCCL_CUDA_* alike on every rank"));
  }
  tuningAgreed_ = true;
}

GpuContext::GpuContext(int device, cudaStream_t stream, KVStore& store, GpuTuning tuning,
                       std::function<void()> freeCached)
    : device_(device),
      stream_(stream),
      store_(store),
      tuning_(tuning),
      staging_(std::make_unique<PinnedBuffer>(device, stream, tuning.pinnedShrinkOps)),
      freeCached_(std::move(freeCached)) {
  cuda::setMaxSms(tuning_.maxSms);
  // Before any gate or node barrier is queued (see preloadKernels).
  CallInFlight call("loading smdccl's CUDA kernels");
  if (cudaError_t e = cuda::preloadKernels(); e != cudaSuccess) {
    (void)cudaGetLastError();
    SMDCCL_WARN("smdccl: could not load the CUDA kernels ahead (", cudaGetErrorString(e),
                "): a first launch behind a stream wait may stall");
  }
}

GpuContext::~GpuContext() {
  // First: a gate an op never opened (it failed while queueing its copies
  // back), and barriers a node-mate that is gone will never meet, must not
  // hold the stream.
  if (gate_) gate_->releaseAll();
  std::unique_ptr<GpuNodeBarrier> barrier;
  {
    std::lock_guard<std::mutex> lock(handlerMu_);
    barrier = std::move(nodeBarrier_);
  }
  barrier.reset();  // outside the lock: it may wait for the stream
  // Nothing of ours may still be running when the buffers go. A stream that
  // does not drain keeps them: leaked, not freed under the GPU's feet (and
  // cudaFreeHost would wait for it for ever).
  try {
    waitForStream(stream_, Deadline::after(kDrainWait), "the group's stream at its end");
  } catch (const CommError& e) {
    if (e.kind() == CommError::Kind::Timeout) {
      if (nccl_) nccl_->abort();
      SMDCCL_WARN("smdccl: the group's CUDA stream did not drain within ", kDrainWait.count(),
                  " s of its end: its buffers are left allocated");
      staging_.release();
      ipc_.release();
      stage_.release();
      return;
    }
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
}

CudaStageDevice& GpuContext::stage() {
  if (!stage_) stage_ = std::make_unique<CudaStageDevice>(freeCached_);
  return *stage_;
}

cudaEvent_t GpuContext::event(size_t i) {
  while (events_.size() <= i) {
    cudaEvent_t e;
    SMDCCL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    events_.push_back(e);
  }
  return events_[i];
}

CudaIpcSpace& GpuContext::ipc(const Hierarchy& h, Deadline deadline) {
  if (ipc_) return *ipc_;
  const int node = h.myNode, localRank = h.myLocal, localSize = h.localSize();
  ipc_ = std::make_unique<CudaIpcSpace>(
      store_,
      CudaIpcSpace::Spec{.keyPrefix = strCat("smdccl/cuda_ipc/node", node),
                         .localRank = localRank,
                         .localSize = localSize,
                         .device = device_,
                         .bytes = tuning_.ipcBytes,
                         .settings = strCat("SMDCCL_CUDA_IPC_MB=", tuning_.ipcBytes >> 20,
                                            ",SMDCCL_CUDA_ONESHOT_KB=", tuning_.oneShotBytes >> 10),
                         .freeCached = freeCached_},
      deadline);
  if (tuning_.streamBarrier) {
    auto made = GpuNodeBarrier::make(store_,
                                     {.keyPrefix = strCat("smdccl/cuda_ipc/node", node, "/flags"),
                                      .device = device_,
                                      .stream = stream_,
                                      .localRank = localRank,
                                      .groupRanks = h.nodes[static_cast<size_t>(h.myNode)]},
                                     deadline);
    // Under the lock: abort() may read it from any thread.
    std::lock_guard<std::mutex> lock(handlerMu_);
    nodeBarrier_ = std::move(made);
    if (nodeBarrier_) nodeBarrier_->onFailure(barrierFailed_);
  }
  return *ipc_;
}

void GpuContext::nodeBarrier(Comm& c, Comm& local, const char* what) {
  if (nodeBarrier_) {
    nodeBarrier_->arrive(c.ctx, what);
    return;
  }
  waitForStream(stream_, c.ctx, what);
  barrier(local);
}

uint32_t GpuContext::barrierEpoch() const { return nodeBarrier_ ? nodeBarrier_->epoch() : 0; }

std::shared_ptr<const BarrierFailure> GpuContext::barrierFailure() const {
  return nodeBarrier_ ? nodeBarrier_->failure() : nullptr;
}

void GpuContext::onBarrierFailure(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> lock(handlerMu_);
  barrierFailed_ = std::move(handler);
  if (nodeBarrier_) nodeBarrier_->onFailure(barrierFailed_);
}

void GpuContext::abortBarriers(const std::string& cause) {
  std::lock_guard<std::mutex> lock(handlerMu_);
  if (nodeBarrier_) nodeBarrier_->abort(cause);
  if (nccl_) nccl_->abort();  // NCCL's kernels stop waiting for peers
}

const IntraChoice& GpuContext::intra(const Hierarchy& h, Deadline deadline) {
  if (intra_) return *intra_;
  IntraRank me;
  char bus[32] = {0};
  SMDCCL_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device_));
  me.gpu = bus;
  me.ncclLoaded = NcclLibrary::get(&me.ncclWhy) != nullptr;
  std::vector<IntraRank> ranks;
  for (const std::string& s :
       allGatherStrings(store_,
                        {strCat("smdccl/cuda_intra/node", h.myNode), h.myLocal, h.localSize(),
                         deadline},
                        encodeIntraRank(me)))
    ranks.push_back(decodeIntraRank(s));
  intra_ = std::make_unique<IntraChoice>(chooseIntraEngine(tuning_.intra, ranks));
  SMDCCL_INFO("CUDA collectives inside node ", h.myNode, " run on ",
              intraEngineName(intra_->engine), ": ", intra_->why);
  return *intra_;
}

NcclNodeComm& GpuContext::nccl(const Hierarchy& h, Deadline deadline) {
  if (nccl_) return *nccl_;
  std::string why;
  const NcclLibrary* lib = NcclLibrary::get(&why);
  if (!lib) throw CommError(CommError::Kind::System, strCat("smdccl: ", why));
  auto made = std::make_unique<NcclNodeComm>(
      *lib, store_,
      NcclNodeComm::Spec{.keyPrefix = strCat("smdccl/cuda_intra/node", h.myNode),
                         .localRank = h.myLocal,
                         .localSize = h.localSize(),
                         .device = device_},
      deadline);
  std::lock_guard<std::mutex> lock(handlerMu_);
  nccl_ = std::move(made);
  return *nccl_;
}

StreamGate* GpuContext::gate() {
  if (gateTried_ || !tuning_.streamBarrier) return gate_.get();
  gateTried_ = true;
  auto page = std::make_unique<MappedFlagPage>();
  if (!page->why().empty()) {
    SMDCCL_INFO("CUDA collectives that run on the host wait for their copies on the host: ",
                page->why());
    return nullptr;
  }
  gateQueue_ = std::make_unique<CudaFlagQueue>(stream_, page->base());
  gate_ = std::make_unique<StreamGate>(reinterpret_cast<uint32_t*>(page->base()));
  gatePage_ = std::move(page);
  return gate_.get();
}

}  // namespace smdccl
