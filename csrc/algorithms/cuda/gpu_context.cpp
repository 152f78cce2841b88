#include "algorithms/cuda/gpu_context.h"

#include <algorithm>
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
  // A tiny allgather of each rank's settings as text: it carries this op's
  // header, so a rank that called another op (or passed CPU tensors) is
  // named as such first.
  constexpr size_t kText = 256;
  const std::string mine = tuning_.describe().substr(0, kText - 1);
  std::vector<char> all(static_cast<size_t>(c.size()) * kText, '\0');
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<size_t>(c.rank()) * kText);
  allgather(c, all.data(), Blocks::equal(c.size(), kText), t);
  for (int r = 0; r < c.size(); ++r) {
    const std::string theirs(all.data() + static_cast<size_t>(r) * kText);
    if (theirs == mine) continue;
    throw CommError(CommError::Kind::Mismatch,
                    strCat("smdccl: ", c.ctx.describe(), ": CUDA settings differ between ranks: rank ",
                           r, " has ", theirs, ", rank ", c.rank(), " has ", mine,
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
  // Before the first launch (see preloadKernels).
  CallInFlight call("loading smdccl's CUDA kernels");
  if (cudaError_t e = cuda::preloadKernels(); e != cudaSuccess) {
    (void)cudaGetLastError();
    SMDCCL_WARN("smdccl: could not load the CUDA kernels ahead (", cudaGetErrorString(e),
                "): a first launch behind a stream wait may stall");
  }
}

GpuContext::~GpuContext() {
  // The watch first: it may call the handler or abort NCCL.
  ncclWatch_.reset();
  // Nothing of ours may still be running when the buffers go. A stream that
  // does not drain keeps them: leaked, not freed under the GPU's feet (and
  // cudaFreeHost would wait for it for ever).
  try {
    waitForStream(stream_, Deadline::after(kDrainWait), "the group's stream at its end");
  } catch (const CommError& e) {
    if (e.kind() == CommError::Kind::Timeout) {
      if (nccl_) nccl_->abort();  // a peer gone: NCCL's kernels stop; the rest is leaked
      SMDCCL_WARN("smdccl: the group's CUDA stream did not drain within ", kDrainWait.count(),
                  " s of its end: its buffers are left allocated");
      staging_.release();
      ipc_.release();
      stage_.release();
      scratch_.release();
      return;
    }
  }
}

CudaStageDevice& GpuContext::stage() {
  if (!stage_) stage_ = std::make_unique<CudaStageDevice>(freeCached_);
  return *stage_;
}

char* GpuContext::scratch(size_t bytes) {
  if (!scratch_)
    scratch_ = std::make_unique<DeviceScratch>(
        freeCached_, "the two-level collectives' intermediate blocks",
        "a reduce-scatter or allgather across nodes holds its node's share of the blocks");
  return scratch_->reserve(bytes);
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
                         .freeCached = freeCached_},
      deadline);
  return *ipc_;
}

void GpuContext::nodeBarrier(Comm& c, Comm& local, const char* what) {
  waitForStream(stream_, c.ctx, what);
  barrier(local);
}

void GpuContext::onDeviceFailure(std::function<void(const std::string&)> handler) {
  std::lock_guard<std::mutex> telling(tellMu_);  // a call in progress ends first
  std::lock_guard<std::mutex> lock(handlerMu_);
  deviceFailed_ = std::move(handler);
}

void GpuContext::ncclFailed(const std::string& why) {
  // The handler may be cleared (the backend going) only once this call of
  // it has ended.
  std::lock_guard<std::mutex> telling(tellMu_);
  std::function<void(const std::string&)> tell;
  {
    std::lock_guard<std::mutex> lock(handlerMu_);
    if (nccl_) nccl_->abort();
    tell = deviceFailed_;
  }
  if (tell) tell(why);
}

void GpuContext::abort(const std::string& why) {
  std::lock_guard<std::mutex> lock(handlerMu_);
  // First: once aborted, NCCL's kernels end early and the watch would take
  // their work for done.
  if (ncclWatch_) ncclWatch_->failAll(why);
  if (nccl_) nccl_->abort();  // NCCL's kernels stop waiting for peers
}

void GpuContext::watchNccl(const OpContext& ctx) {
  if (ncclWatch_)
    ncclWatch_->watch(stream_, ctx.deadline, [ctx] { return ctx.describe(); }, opFailures_.all());
}

const IntraChoice& GpuContext::intra(const Hierarchy& h, Deadline deadline) {
  if (intra_) return *intra_;
  IntraRank me;
  char bus[32] = {0};
  SMDCCL_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device_));
  me.gpu = bus;
  me.ncclLoaded = NcclLibrary::get(&me.ncclWhy) != nullptr;
  // Every rank of the group reports (chooseGroupEngine: the nodes must agree).
  int groupSize = 0;
  for (const auto& node : h.nodes) groupSize += static_cast<int>(node.size());
  const std::vector<std::string> all = allGatherStrings(
      store_, {"smdccl/cuda_intra/group", h.nodes[h.myNode][h.myLocal], groupSize, deadline},
      encodeIntraRank(me));
  std::vector<std::vector<IntraRank>> nodes;
  for (const auto& node : h.nodes) {
    nodes.emplace_back();
    for (int r : node) nodes.back().push_back(decodeIntraRank(all[static_cast<size_t>(r)]));
  }
  intra_ = std::make_unique<IntraChoice>(chooseGroupEngine(tuning_.intra, nodes));
  ncclChosen_.store(intra_->engine == IntraEngine::Nccl, std::memory_order_release);
  SMDCCL_INFO("CUDA collectives inside the nodes (this rank's: ", h.myNode, ") run on ",
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
  NcclNodeComm* comm = made.get();
  auto watch = std::make_unique<StreamWatch>(
      device_, StreamWatch::Hooks{.probe = [comm] { return comm->asyncError(); },
                                  .failed = [this](const std::string& why) { ncclFailed(why); }});
  std::lock_guard<std::mutex> lock(handlerMu_);
  nccl_ = std::move(made);
  ncclWatch_ = std::move(watch);
  return *nccl_;
}

}  // namespace smdccl
