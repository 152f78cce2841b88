#pragma once
// The device side of one collective on CUDA tensors, seen from the
// device-neutral backend code (backend.cpp, the *_ops.cpp files): this
// header needs no CUDA. The CUDA build implements it in backend/cuda/;
// CPU tensors have none (nullptr).
//
// Life of a CUDA collective:
//   caller thread   an event is recorded on the caller's current stream;
//                   every tensor is recordStream'ed on the internal stream
//   progress thread prepare(): the internal stream waits for that event,
//                   staged inputs are copied to pinned host memory;
//                   beforeBody(): the host waits for the copies in;
//                   the body runs (kernels on the internal stream: allreduce,
//                   reduce, reduce_scatter_tensor, all_gather_into_tensor,
//                   broadcast;
//                   or host algorithms on the pinned copies: the rest);
//                   finishBody(): staged outputs are copied back;
//                   signal(seq): an event is recorded behind the op's GPU work
//   Work.wait()     once that event is recorded (the host waits for it), the
//                   caller's current stream waits for it; the future is
//                   CUDA-aware.
// NCCL's collectives inside a node are queued on the internal stream whole:
// the event is recorded at once and Work.wait() does not wait on the host.
// NCCL work that does not finish by the op's deadline fails the group from a
// watch thread (onDeviceFailure) and aborts the NCCL communicator. The
// collectives whose steps the host drives (CUDA IPC steps meeting at host
// barriers, staged steps, host copies) record the event once they are done.
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/core/Stream.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/comm.h"
#include "algorithms/tuning.h"
#include "common/op_context.h"
#include "backend/work.h"
#include "common/deadline.h"
#include "common/store.h"

namespace smdccl {

class DeviceOp {
 public:
  virtual ~DeviceOp() = default;
  // Where the body's tensor ops run (the progress thread's current stream).
  virtual c10::Stream stream() const = 0;
  // A pinned host copy of device tensor `dev` for a body that runs on the
  // host: copied in before the body when `in`, back after it when `out`.
  virtual at::Tensor host(const at::Tensor& dev, bool in, bool out) = 0;
  // Queues the copies in (no host wait).
  virtual void prepare(const OpContext& ctx) = 0;
  // After prepare() and the op's checks, right before its body: the host
  // waits for the copies in.
  virtual void beforeBody(const OpContext& ctx) = 0;
  // Waits for the copies in (before a check that reads the host copies).
  virtual void awaitInputs(const OpContext& ctx) = 0;
  // Whether the op runs on host() copies.
  virtual bool hostStaged() const { return false; }
  // Whether the host drives some step of the device collective `sig` in a
  // group of nodes `h` (IPC steps at host barriers, staged steps across
  // nodes or without CUDA IPC), or it runs on host() copies: such an op
  // runs on the progress thread, never on the caller's.
  virtual bool hostDriven(const Hierarchy& h, const OpSignature& sig) const { return hostStaged(); }
  virtual void finishBody(const OpContext& ctx) = 0;
  // Records the event behind the op's GPU work (also after a failure, so
  // that nothing waits for it forever).
  virtual void signal(uint64_t seq) noexcept = 0;
  // In-place allreduce of device memory (CUDA IPC / staged): a.count
  // a.dt elements at device address a.buf, reduced with a.op.
  virtual void allreduce(Comm& c, const CollectiveArgs& a, const Tuning& t) = 0;
  // Reduce of device memory: a.count a.dt elements at a.buf, reduced with
  // a.op into group rank a.root's a.buf (elsewhere a.buf is scratch).
  virtual void reduce(Comm& c, const CollectiveArgs& a, const Tuning& t) = 0;
  // Reduce-scatter of device memory (see BlockReduction).
  virtual void reduceScatter(Comm& c, const BlockReduction& r, const Tuning& t) = 0;
  // Allgather of device memory: r.in and every peer's block into r.out.
  virtual void allgather(Comm& c, const BlockGather& g, const Tuning& t) = 0;
  // Broadcast of device memory in place: a.bytes at a.buf from group rank a.root.
  virtual void broadcast(Comm& c, const CollectiveArgs& a, const Tuning& t) = 0;
  // What the op's Work waits on. `what` names the op in errors ("allreduce #7 on group '0'");
  // `timeout`: the op's (its deadline, from when it starts).
  virtual std::shared_ptr<DeviceCompletion> completion(std::function<std::string()> what,
                                                       std::chrono::milliseconds timeout) = 0;
};

// Per group: makes the DeviceOp of each call on CUDA tensors. The CPU build's
// rejects CUDA tensors with a ValueError that says so.
class DeviceOps {
 public:
  virtual ~DeviceOps() = default;
  // nullptr when every tensor is on the CPU; a ValueError when tensors of
  // one call are on different devices, or on another device than earlier
  // calls of this group.
  virtual std::shared_ptr<DeviceOp> begin(const std::vector<at::Tensor>& tensors,
                                          const char* opName) = 0;
  // The CUDA device of a call's tensors (-1: all on the CPU), with begin()'s
  // checks, for calls that need no DeviceOp (point-to-point).
  virtual int deviceOf(const std::vector<at::Tensor>& tensors, const char* opName) = 0;
  // Point-to-point on CUDA tensors goes through host memory. A send's
  // pinned copy of `dev` is queued on the caller's current stream, behind
  // its work, without blocking the caller; `ready` (polled by the send/recv
  // loop before it sends) says whether that copy has ended.
  struct HostCopy {
    at::Tensor host;
    std::function<bool()> ready;
  };
  virtual HostCopy hostCopyForSend(const at::Tensor& dev) = 0;
  // A receive into CUDA tensor `dev` lands in pinned `host`. `land` runs
  // once, where the receive completes (the send/recv loop, or the caller's
  // thread when the message was there first): with `arrived`, it queues the
  // copy into `dev` after the work that the caller had queued on its current
  // stream when it called recv (which may still read or write `dev`), and
  // marks the copy's end; either way it releases `completion`'s waits. The
  // work's `completion`: wait() makes the caller's stream wait for the copy
  // (the host waits only for the message, as with ProcessGroupNCCL).
  struct HostLanding {
    at::Tensor host;
    std::function<void(bool arrived)> land;
    std::shared_ptr<DeviceCompletion> completion;
  };
  virtual HostLanding hostForRecv(const at::Tensor& dev) = 0;
  // Bytes the group's collectives on device tensors copied to host memory
  // and back (PCIe traffic of the staged paths); zero without a GPU.
  struct CopiedBytes {
    uint64_t toHost = 0, fromHost = 0;
  };
  virtual CopiedBytes copiedBytes() const { return {}; }
  // Pinned host memory the group holds for staging (its buffer, and
  // outgrown ones not freed yet); zero without a GPU.
  virtual size_t pinnedStagingBytes() const { return 0; }
  // Called (on a thread of smdccl's) when a collective's GPU work failed
  // after its op had returned: NCCL's work timed out or failed. nullptr: nobody.
  virtual void onDeviceFailure(std::function<void(const std::string&)> handler) {}
  // ProcessGroup.abort(): NCCL's work queued and waiting for node-mates stops waiting.
  virtual void abort(const std::string& cause) {}
};
std::unique_ptr<DeviceOps> makeDeviceOps(KVStore& store,
                                         std::function<std::chrono::milliseconds()> timeout);

// A host copy where there is a device op, the tensor itself otherwise.
inline at::Tensor hostOf(const std::shared_ptr<DeviceOp>& d, const at::Tensor& t, bool in,
                         bool out) {
  return d ? d->host(t, in, out) : t;
}
inline std::vector<at::Tensor> hostOf(const std::shared_ptr<DeviceOp>& d,
                                      const std::vector<at::Tensor>& ts, bool in, bool out) {
  std::vector<at::Tensor> r;
  r.reserve(ts.size());
  for (const auto& t : ts) r.push_back(hostOf(d, t, in, out));
  return r;
}

// Every tensor of a call, for DeviceOps::begin.
inline std::vector<at::Tensor> allOf(std::vector<at::Tensor> a, const std::vector<at::Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace smdccl
