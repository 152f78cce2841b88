#pragma once
// The barrier of a node's ranks between the steps of a CUDA-IPC collective,
// queued on the group's stream (algorithms/stream_barrier.h): the host
// queues the whole collective and returns, never waiting for the GPU. A
// thread of its own watches the queued barriers: one that a node-mate has
// not reached within the op's deadline fails the group (the handler the
// backend gives names the op and the ranks) and lets this rank's stream
// drain, so that nothing waits on the GPU for ever.
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/op_context.h"
#include "algorithms/stream_barrier.h"
#include "common/store.h"
#include "transport/cuda/stream_flags.h"
#include "transport/node_flags.h"

namespace smdccl {

// The first failure of a node's stream barriers (a timeout, an abort),
// shared with the works of the ops that queued them: they may outlive the
// group. Thread-safe.
class BarrierFailure {
 public:
  // Records the first failure, at barrier `epoch`; false if one was recorded.
  bool record(const std::string& msg, uint32_t epoch);
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  // The error of an op whose barriers were (from, upTo]: every barrier
  // queued from the failed one on was let pass, not met. nullptr otherwise.
  std::exception_ptr of(uint32_t from, uint32_t upTo) const;

 private:
  mutable std::mutex mu_;
  std::atomic<bool> failed_{false};
  uint32_t epoch_ = 0;
  std::exception_ptr error_;
};

class GpuNodeBarrier {
 public:
  struct Spec {
    std::string keyPrefix;  // the store rounds that set the flags up
    int device;
    cudaStream_t stream;
    int localRank;
    std::vector<int> groupRanks;  // the node's ranks in the group, by local index
  };
  // Collective over the node's ranks. nullptr (and a log line saying why)
  // when some rank's GPU cannot map the flags: the host meets the barriers.
  static std::unique_ptr<GpuNodeBarrier> make(KVStore& store, const Spec& s, Deadline deadline);
  // Waits (up to kDrainWait) for the stream to pass its barriers; then
  // fails them (the node hears the verdict) and lets it pass the rest (a
  // node-mate that is gone never arrives); past 2 x kDrainWait the flags
  // stay mapped for good.
  ~GpuNodeBarrier();
  static constexpr std::chrono::seconds kDrainWait{10};
  GpuNodeBarrier(const GpuNodeBarrier&) = delete;
  GpuNodeBarrier& operator=(const GpuNodeBarrier&) = delete;

  // Queues this rank's arrival at the next barrier, and the wait for its
  // node-mates', on the stream; `what` names the step in a timeout.
  void arrive(const OpContext& ctx, const char* what);
  // The latest barrier queued (ops note it before and after their steps).
  uint32_t epoch() const { return barrier_.lastEpoch(); }
  // Whether the stream has passed everything queued on it.
  bool drained() const;
  // The barriers' failure record.
  std::shared_ptr<const BarrierFailure> failure() const { return failure_; }
  // Called once, on the watch thread, when a barrier times out (nullptr: nobody).
  void onFailure(std::function<void(const std::string&)> handler);
  // The group was aborted: the stream passes the barriers it has queued.
  void abort(const std::string& cause);

 private:
  GpuNodeBarrier(const Spec& s, std::unique_ptr<NodeFlags> flags);
  void watch();
  // Records `cause` as the failure at the oldest barrier not passed (or the
  // next one) and tells the node (the verdict); the first failure stays.
  void failAtOldest(const std::string& cause);

  Spec spec_;
  std::unique_ptr<NodeFlags> flags_;
  StreamBarrier barrier_;
  CudaFlagQueue queue_;
  BarrierWatch pending_;

  std::mutex arriveMu_;  // arrive() against abort()
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::shared_ptr<BarrierFailure> failure_ = std::make_shared<BarrierFailure>();
  std::mutex handlerMu_;
  std::function<void(const std::string&)> handler_;
  std::thread thread_;
};

}  // namespace smdccl
