#pragma once
// Tensor fusion (SMDCCL_FUSION_MB): a small async allreduce, when it runs,
// takes in the fusable allreduces queued right behind it that every rank
// has (two tiny agreement rounds: the count, then the riders' sizes, dtypes
// and ops), reduces them all as one flat collective, and the op runner then
// completes the riders with its outcome.
#include <ATen/ATen.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "algorithms/comm.h"
#include "backend/op_request.h"
#include "backend/progress_thread.h"

namespace smdccl {

class AllreduceFusion {
 public:
  static constexpr size_t kFusableBytes = 1 << 20;  // "small": fused with its neighbours

  // `queue`: the progress thread whose queued allreduces are taken in;
  // `maxBytes`: the most one fused collective carries (0: no fusion).
  AllreduceFusion(ProgressThread& queue, size_t maxBytes) : queue_(queue), maxBytes_(maxBytes) {}

  // Whether an allreduce of `t` may open or join a fused collective. The
  // same answer on every rank for the same call (not async_op, which ranks
  // may choose differently): a fusable op opens with an agreement round.
  bool fusable(const at::Tensor& t, const ReduceSpec& spec, int groupSize) const {
    return maxBytes_ > 0 && groupSize > 1 && t.nbytes() <= kFusableBytes &&
           !spec.preScaleTensor.defined();
  }

  // How `run` reduces: `first` alone, in place (nothing was fused), or a
  // batch packed flat (same dtype and op; CUDA tensors on the op's device).
  struct Reducers {
    std::function<void(QueuedAllreduce& first)> one;
    std::function<void(std::vector<at::Tensor>&, std::vector<ReduceSpec>&,
                       const std::shared_ptr<DeviceOp>&)>
        flat;
  };
  // Runs `first` with the riders every rank has; each rider takes the next
  // number of `runSeq` (the group's run order).
  void run(Comm& c, QueuedAllreduce& first, std::atomic<uint64_t>& runSeq, const Reducers& reduce);

  // The riders of the op that ran last, for the op runner to complete after
  // it (also when it failed): their Works, and their CUDA sides with their
  // op numbers (signalled first, so that their waits are released).
  struct Riders {
    std::vector<c10::intrusive_ptr<SmdcclWork>> works;
    std::vector<std::pair<std::shared_ptr<DeviceOp>, uint64_t>> devices;
  };
  // Before an op runs: nothing carried over from the previous one.
  void clearRiders() { riders_ = {}; }
  size_t riderCount() const { return riders_.works.size(); }
  // Moved out: completing the riders may run ops (their callbacks) that run here again.
  Riders takeRiders() { return std::exchange(riders_, {}); }

  // Allreduces that ran inside another's collective, and the fused
  // collectives that carried them.
  uint64_t fusedAllreduces() const { return fusedOps_.load(); }
  uint64_t fusedCollectives() const { return fusedCollectives_.load(); }

 private:
  // Whether every rank's first `count` queued fusable allreduces have the
  // same sizes, dtypes and ops (one tiny round).
  bool ridersAgree(Comm& c, size_t count);

  ProgressThread& queue_;
  size_t maxBytes_;
  // Touched only by the task running (the progress thread serializes).
  Riders riders_;
  std::atomic<uint64_t> fusedOps_{0}, fusedCollectives_{0};
};

}  // namespace smdccl
