#pragma once
// The handle a collective returns at once. Completed by the progress thread
// (or a send/recv thread) with the output tensors or the error; wait() spins
// briefly, then sleeps.
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace smdccl {

// GPU-side completion of a work on CUDA tensors (backend/cuda implements
// it): wait() makes the caller's current stream wait for the op's GPU work.
class DeviceCompletion {
 public:
  virtual ~DeviceCompletion() = default;
  // The GPU has finished the op's work.
  virtual bool done() const = 0;
  // Once the op's GPU work is queued (the host waits for that, up to
  // `timeout` when it is positive, else up to the group timeout), the
  // caller's current stream waits for it.
  virtual void blockCurrentStream(std::chrono::milliseconds timeout) = 0;
  virtual c10::Device device() const = 0;
  // The stream the op's GPU work runs on: futures complete on it.
  virtual c10::Stream stream() const = 0;
  // The op's GPU work failed after the op had returned; nullptr otherwise.
  virtual std::exception_ptr error() const { return nullptr; }
};

class SmdcclWork : public ::c10d::Work {
 public:
  // `what` names the op in a wait() timeout, e.g. "allreduce #7 on group 'g'";
  // it is built only if needed, and must own what it reads: a Work may
  // outlive its group.
  SmdcclWork(int rank, ::c10d::OpType type, std::vector<at::Tensor> outputs,
             std::function<std::string()> what);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) override;
  void synchronize() override;
  std::vector<at::Tensor> result() override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  float getDuration() const override;
  // recv from any source: the rank that sent (torch's work._source_rank()).
  int sourceRank() const override;
  void setSourceRank(int rank) { sourceRank_.store(rank, std::memory_order_release); }

  // Called once, from the thread that ran the work.
  void markStarted();
  void complete(std::exception_ptr error);
  // Before the work is queued: a CUDA work completes on the GPU too.
  void setDeviceCompletion(std::shared_ptr<DeviceCompletion> d) { device_ = std::move(d); }
  // Before the work is queued: the key() of the ProgressThread that will
  // run it. A wait() from one of its tasks before the work ran (a completion
  // callback waiting for an op queued behind it) could never return: it
  // raises instead.
  void setRunner(const void* runner) { runner_ = runner; }
  // Before the work is queued: the future's value is the outputs in lists
  // of `perList` (all_gather_coalesced's per-rank lists, as gloo's).
  void setOutputLists(size_t perList) { perList_ = perList; }

 private:
  std::vector<at::Tensor> outputs_;
  std::function<std::string()> what_;
  // Created on the first getFuture() (DDP asks; plain calls never do).
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::atomic<bool> done_{false};
  std::shared_ptr<DeviceCompletion> device_;
  std::chrono::steady_clock::time_point started_, finished_;
  std::atomic<int> sourceRank_{-1};
  const void* runner_ = nullptr;
  size_t perList_ = 0;

  void markDone(c10::ivalue::Future& f) const;
};

}  // namespace smdccl
