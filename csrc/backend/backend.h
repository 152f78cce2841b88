#pragma once
// smdccl as a c10d::Backend. The only layer (with bindings.cpp) that knows
// torch: it validates arguments at call time, then queues each collective on
// its progress thread and returns a Work at once.
#include <cstdint>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <unordered_set>

#include "algorithms/comm.h"
#include "algorithms/tuning.h"
#include "backend/allreduce_fusion.h"
#include "backend/backend_config.h"
#include "backend/device_op.h"
#include "backend/group_children.h"
#include "backend/group_failure.h"
#include "backend/op_request.h"
#include "backend/progress_thread.h"
#include "backend/reduce_semantics.h"
#include "backend/scratch_pool.h"
#include "backend/watchdog.h"
#include "backend/work.h"
#include "common/store.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

namespace smdccl {

// Whether this torch's c10d::Backend has the split() virtual that
// SmdcclBackend::split overrides (torch >= 2.8 or so): only then may the
// backend say it supports splitting, else torch would call the base's,
// which raises.
template <typename B, typename = void>
struct TorchHasBackendSplit : std::false_type {};
template <typename B>
struct TorchHasBackendSplit<
    B, std::void_t<decltype(static_cast<c10::intrusive_ptr<B> (B::*)(
                                const c10::intrusive_ptr<::c10d::Store>&, const std::vector<int>&,
                                const c10::intrusive_ptr<typename B::Options>&)>(&B::split))>>
    : std::true_type {};

// Likewise for shrink() (torch >= 2.10 or so: dist.shrink_group).
template <typename B, typename = void>
struct TorchHasBackendShrink : std::false_type {};
template <typename B>
struct TorchHasBackendShrink<
    B, std::void_t<decltype(static_cast<c10::intrusive_ptr<B> (B::*)(
                                const std::vector<int64_t>&, int,
                                const c10::intrusive_ptr<typename B::Options>&)>(&B::shrink))>>
    : std::true_type {};

class SmdcclBackend : public ::c10d::Backend {
 public:
  SmdcclBackend(c10::intrusive_ptr<::c10d::Store> store, BackendConfig cfg);
  ~SmdcclBackend() override;

  const std::string getBackendName() const override { return "smdccl"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeoutMs_ = timeout.count(); }
  // Collectives issued so far; TORCH_DISTRIBUTED_DEBUG=DETAIL's wrapper
  // compares it across ranks to catch mismatched calls.
  void setSequenceNumberForGroup() override {}  // every rank starts at 0
  uint64_t getSequenceNumberForGroup() override { return seq_.load(); }

  c10::intrusive_ptr<::c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                             const ::c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                             const ::c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const ::c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                          const ::c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                             std::vector<at::Tensor>& inputs,
                                             const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                   const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputLists, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const ::c10d::GatherOptions& opts) override;
  // torch >= 2.14's dist.gather_single / gather_into_tensor: the root's
  // output is one flat tensor of world_size blocks. No `override`: older
  // torch (2.11 on the GPU machine) has no such virtual, and then this is
  // simply unused.
  c10::intrusive_ptr<::c10d::Work> gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                                      const ::c10d::GatherOptions& opts);
  c10::intrusive_ptr<::c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                           std::vector<std::vector<at::Tensor>>& inputs,
                                           const ::c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const ::c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                                 std::vector<int64_t>& outputSplits,
                                                 std::vector<int64_t>& inputSplits,
                                                 const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                            std::vector<at::Tensor>& inputs,
                                            const ::c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<::c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                        int tag) override;
  c10::intrusive_ptr<::c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors,
                                                 int tag) override;
  c10::intrusive_ptr<::c10d::Work> barrier(const ::c10d::BarrierOptions& opts) override;
  // dist.monitored_barrier (gloo's debugging barrier; torch >= 2.14 offers it
  // on any CPU backend): blocks the caller; rank 0 raises naming the ranks
  // that did not come within opts.timeout (every one with waitAllRanks) and
  // what each last ran, and the ranks that came raise with the same
  // message. Through the store (common/monitored_barrier.h): it works
  // whatever state the links are in.
  void monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) override;
  // ProcessGroup.abort() (torch's _abort_process_group), from any thread:
  // the op in flight stops at its next wait, what is queued and every later
  // call fails naming the abort, and peers see the links close and fail at
  // once. The group cannot be used again.
  void abort() override;
  // backend.get_error() (fault-tolerant trainers poll it): SUCCESS until a
  // collective failed the group, then TIMEOUT, REMOTE_ERROR (a peer died or
  // failed first) or COMM_ERROR (this rank: a link, an allocation, abort()).
  ::c10d::ErrorType getError() override;

  // dist.shrink_group(ranks_to_exclude): the group without those ranks,
  // built by the remaining ranks only (the excluded ones may be dead), over
  // a namespace of this group's store that they agree on (their count of
  // shrinks). shrinkFlags SHRINK_ABORT (1) aborts this group first, so that
  // an op stuck waiting for an excluded rank does not hold it. The child
  // keeps this group's compression and timeout (or `opts`' timeout). No
  // `override` on either: older torch has no such virtuals.
  bool supportsShrinking() const { return TorchHasBackendShrink<::c10d::Backend>::value; }
  c10::intrusive_ptr<::c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                             int shrinkFlags,
                                             const c10::intrusive_ptr<Options>& opts) {
    return children_.shrink(ranksToExclude, shrinkFlags, opts, [this] { abort(); });
  }

  // dist.split_group(), and DeviceMesh / new_group() once the default group
  // is bound to a device (init_process_group(device_id=...)): a child group
  // of `ranks` (this group's ranks; this rank's place in the list is its
  // rank in the child), built over the child's store as new_group() builds
  // one, with this group's compression and `opts`' timeout and name. Returns
  // nullptr where this rank is not in `ranks`. torch calls split() once per
  // device type the group serves (cpu, cuda) with the same store: both get
  // the one child. No `override`: the virtual's signature is torch's newer
  // API; where it differs this is simply unused.
  bool supportsSplitting() const override { return TorchHasBackendSplit<::c10d::Backend>::value; }
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<Options>& opts) {
    return children_.split(store, ranks, opts);
  }

  // Introspection for tests and `python -m smdccl.info`.
  std::string describeTopology() const { return mesh_->topology().describe(); }
  std::vector<int> localRanks() const { return mesh_->localRanks(); }
  std::string listenAddress() const { return mesh_->listenAddress(); }
  std::string compression() const { return cfg_.int8 ? "int8" : wireName(cfg_.wire); }
  // The next allreduce or reduce_scatter_tensor this thread issues keeps
  // the int8 wire's error feedback under `key` (a DDP bucket's index, an
  // FSDP2 module's): what its quantizations round away is carried into the
  // next op with the same key. The mark is the thread's (whatever group
  // takes it): callers set it right before their call and -1 after. No
  // effect on a group without the int8 wire.
  void int8FeedbackNext(int64_t key) { feedbackNext_ = key; }
  // Ends the residuals kept under `key` (a DDP bucket that a rebuilt layout
  // replaced): freed by the next op that asks for feedback. Any thread.
  void int8FeedbackDrop(int64_t key);
  // Keys with residuals held, as of the last op that asked for feedback.
  size_t int8FeedbackKeys() const { return int8Keys_.load(std::memory_order_acquire); }
  // Whether this group's float32 reductions put 16 bits on some hop
  // (Comm::compressesSomeHop over the whole group).
  bool compressesSomeHop() const;
  uint64_t rejectedConnections() const { return mesh_->rejectedConnections(); }
  // Allreduces that ran inside another's collective (fusion), and the fused
  // collectives that carried them.
  uint64_t fusedAllreduces() const { return fusion_->fusedAllreduces(); }
  uint64_t fusedCollectives() const { return fusion_->fusedCollectives(); }
  // CPU seconds the group's progress thread has used (its thread clock).
  double progressCpuSeconds() const { return progress_->cpuSeconds(); }
  // Bytes this group's collectives on CUDA tensors copied to host memory
  // and back ({to_host, from_host}; zero for CPU tensors).
  std::pair<uint64_t, uint64_t> deviceCopiedBytes() const {
    auto b = deviceOps_->copiedBytes();
    return {b.toHost, b.fromHost};
  }
  // Pinned host memory the group holds for staging CUDA tensors.
  size_t pinnedStagingBytes() const { return deviceOps_->pinnedStagingBytes(); }

 private:
  // The op runner (op_runner.cpp). Runs `r.body` on the progress thread (or
  // inline: see there) with a fresh deadline; the Work completes with
  // `r.outputs` or the error.
  c10::intrusive_ptr<::c10d::Work> enqueue(OpRequest r);
  // recv and recvAnysource (srcRank -1): posts the receive, CUDA landing included.
  c10::intrusive_ptr<::c10d::Work> postRecv(const at::Tensor& t, int srcRank, int tag);
  // all_reduce of a sparse COO tensor (sparse_allreduce.h): SUM or AVG, CPU.
  c10::intrusive_ptr<::c10d::Work> allreduceSparse(at::Tensor t,
                                                   const ::c10d::AllreduceOptions& opts);
  // A failure that leaves the group's ranks out of step (`cause`: what
  // happened on this rank, in op `ctx`): records it as the group's cause,
  // aborts the links so that peers fail at once, fails what is queued.
  // Returns the error the op's work completes with.
  std::exception_ptr failGroup(const OpContext& ctx, CommError::Kind kind,
                               const std::string& cause);
  // A collective's GPU work failed after its op had returned (a node
  // barrier timed out; `cause` names the op and the ranks): the group fails
  // as failGroup fails it, from the thread that found it.
  void failFromDevice(const std::string& cause);
  // From a thread other than the progress thread (abort(), a GPU failure):
  // has the progress thread record `cause` for the peers and close the
  // links, then stop; what is queued fails at once.
  void tellPeersAndStop(const std::string& cause);
  // Runs one op where enqueue() put it: its checks, its body, its failure
  // handling, the completion of its Work and of the ops fused into it.
  void runWork(QueuedOp& op);
  // runWork's parts: what the op knows of itself; its checks and body, the
  // error they end with (the group failed where the ranks are out of step);
  // the completion of its Work, then of its riders'.
  OpContext contextOf(const QueuedOp& op, uint64_t seq) const;
  std::exception_ptr runChecksAndBody(QueuedOp& op, Comm& c);
  void completeWithRiders(QueuedOp& op, uint64_t seq, std::exception_ptr err);
  // SMDCCL_NAN_CHECK: the ranks agree (one tiny round) on whose inputs hold
  // NaN/Inf; if any do, every rank raises naming them, before any data moves.
  void checkFinite(Comm& c, const std::vector<at::Tensor>& inputs);
  std::chrono::milliseconds effectiveTimeout(std::chrono::milliseconds opTimeout) const;

  BackendConfig cfg_;
  std::atomic<uint64_t> monitoredBarriers_{0};
  // The store torch gave this group, under this incarnation's prefix (store_
  // wraps it).
  c10::intrusive_ptr<::c10d::Store> c10dStore_;
  std::shared_ptr<KVStore> store_;  // shared with the watchdog's thread
  std::unique_ptr<Watchdog> watchdog_;
  std::unique_ptr<Mesh> mesh_;
  std::unique_ptr<P2PEngine> p2p_;
  std::vector<int> ring_;
  Hierarchy levels_;
  // Per peer, what the collectives' exchanges keep between ops (op headers).
  ExchangeBook exchangeBook_;
  Tuning tuning_;
  ScratchPool scratch_;  // host copies for ops that leave their input as it was
  // The wire a reduction crosses and where AVG divides: the reductions' bodies ask it.
  ReduceSemantics reduce_{WireChoice{cfg_.wire, cfg_.wireIntra, cfg_.int8}};
  WaitPolicy waitPolicy_;
  std::atomic<int64_t> timeoutMs_;
  // split()'s and shrink()'s groups, with this group's settings.
  GroupChildren children_{cfg_, c10dStore_,
                          [this] { return std::chrono::milliseconds(timeoutMs_.load()); }};
  // Ops issued (getSequenceNumberForGroup): caller threads and callbacks.
  std::atomic<uint64_t> seq_{0};
  // Ops started, in run order: the number the ranks compare (op headers,
  // watchdog). Not issue order: an op that a completion callback issues runs
  // before those already queued (see enqueue). Advanced by the running task
  // (runMu_ of the progress thread serializes), or by a caller once the
  // thread has stopped after a failure (hence atomic).
  std::atomic<uint64_t> runSeq_{0};
  // The int8 wire's error feedback: the key the next allreduce issued on
  // this thread carries (-1: none; set by int8FeedbackNext), and the
  // residuals per key (touched only by the ops, which run one at a time).
  static thread_local int64_t feedbackNext_;
  std::unordered_map<int64_t, Int8Residuals> int8Residuals_;
  std::mutex droppedMu_;
  std::vector<int64_t> droppedKeys_;  // under droppedMu_, until int8FeedbackFor drops them
  // Dropped for good: an op still queued under one gets no feedback (the
  // key's owner has forgotten it; nothing would ever free new residuals).
  std::unordered_set<int64_t> retiredKeys_;
  std::atomic<size_t> int8Keys_{0};
  // The residuals under `key` (none for key -1 or a group without the
  // int8 wire), after dropping the keys int8FeedbackDrop named. On the
  // op's thread.
  Int8Feedback int8FeedbackFor(int64_t key);
  bool nanCheck_ = false;      // SMDCCL_NAN_CHECK
  bool detailChecks_ = false;  // SMDCCL_DEBUG=DETAIL / TORCH_DISTRIBUTED_DEBUG=DETAIL
  GroupFate fate_;             // a failed collective (or abort()) leaves the group unusable
  std::unique_ptr<DeviceOps> deviceOps_;      // CUDA tensors' streams and buffers
  std::unique_ptr<AllreduceFusion> fusion_;   // over progress_'s queue
  std::unique_ptr<ProgressThread> progress_;  // last: stops first
};

}  // namespace smdccl
