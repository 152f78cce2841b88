#pragma once
// What a c10d call hands the op runner (SmdcclBackend::enqueue): the op's
// name and kind, the call every rank must agree on, its body (the data
// movement, run on the progress thread), its Work's outputs and options;
// and what the runner keeps of it until the op ends.
#include <cstdint>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <vector>

#include "algorithms/comm.h"
#include "backend/device_op.h"
#include "backend/progress_thread.h"
#include "backend/reduce_scaling.h"
#include "backend/work.h"

namespace smdccl {

// An op's number in the group's run order, set when it starts (0 before).
using OpNumber = std::shared_ptr<std::atomic<uint64_t>>;

// An async allreduce waiting in the queue that the one running before it may
// take into its collective (tensor fusion).
struct QueuedAllreduce : Fusable {
  at::Tensor tensor;
  ReduceSpec spec;
  std::shared_ptr<DeviceOp> device;  // CUDA tensors: the op's device side (nullptr: CPU)
  c10::intrusive_ptr<SmdcclWork> work;
  OpNumber number;
};

// A collective as this rank calls it: what every rank must agree on, and the
// tensors whose contents it sends (checked under SMDCCL_NAN_CHECK).
struct OpCall {
  OpSignature sig;
  std::vector<at::Tensor> inputs;
};

// One call, as enqueue() takes it (designated initializers at the call
// sites: `enqueue({.type = ..., .name = "broadcast", ...})`).
struct OpRequest {
  ::c10d::OpType type = ::c10d::OpType::UNKNOWN;
  const char* name = "";  // "allreduce": errors, traces and logs name the op by it
  OpCall call;
  std::vector<at::Tensor> outputs;  // what the Work's result() returns
  size_t outputsPerList = 0;        // > 0: its future's value nests them (SmdcclWork)
  std::function<void(Comm&)> body;
  // The call's options: timeout (kUnsetTimeout: the group's), async_op.
  std::chrono::milliseconds timeout = ::c10d::kUnsetTimeout;
  bool asyncOp = true;
  std::shared_ptr<QueuedAllreduce> fusable;  // a small allreduce others may join
  std::shared_ptr<DeviceOp> device;          // CUDA tensors (nullptr: CPU)
};

// An op from enqueue() to its end.
struct QueuedOp {
  OpRequest request;
  c10::intrusive_ptr<SmdcclWork> work;
  OpNumber number;
  std::chrono::milliseconds timeout;  // the op's own, or the group's
  int64_t queuedUs = 0;               // trace::nowUs() when queued (0: not tracing)
};

}  // namespace smdccl
