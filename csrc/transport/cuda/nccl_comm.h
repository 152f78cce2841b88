#pragma once
// One NCCL communicator over the ranks of a node, for a group's CUDA
// collectives inside the node (algorithms/intra_engine.h says when): NCCL
// moves the data over NVLink / PCIe, on the stream the caller names.
// The unique id goes from local rank 0 to the others through the group's
// store. ncclCommInitRank blocks until every local rank has joined; it
// runs on a thread of its own, so that a node-mate that never comes fails
// this rank at the deadline, naming the wait, instead of hanging it.
#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "common/deadline.h"
#include "common/dtype.h"
#include "common/store.h"
#include "transport/nccl_library.h"

namespace smdccl {

class NcclNodeComm {
 public:
  struct Spec {
    std::string keyPrefix;  // where local rank 0 publishes the unique id
    int localRank = 0;
    int localSize = 1;
    int device = 0;
  };
  // Collective over the node's ranks (each calls it with its local index).
  NcclNodeComm(const NcclLibrary& lib, KVStore& store, const Spec& s, Deadline deadline);
  // ncclCommDestroy (after abort(): nothing more).
  ~NcclNodeComm();
  NcclNodeComm(const NcclNodeComm&) = delete;
  NcclNodeComm& operator=(const NcclNodeComm&) = delete;

  // One call's buffers: count elements (per rank's block for reduceScatter's
  // output and allGather's input) of dt; op for the reductions. dt and op
  // must have NCCL forms (NcclLibrary::dataType / redOp).
  struct Args {
    const void* in = nullptr;
    void* out = nullptr;
    size_t count = 0;
    DType dt = DType::U8;
    RedOp op = RedOp::Sum;
    int root =
        0;  // broadcast: the local rank whose `in` everyone gets; reduce: the one that gets the sum
  };
  // Each queues NCCL's collective on `stream` (a cudaStream_t) and throws a
  // CommError if NCCL refuses it, or if the communicator was aborted (the
  // check is at the call's start: an abort() racing a call already inside
  // NCCL is NCCL's to handle, as with torch's ProcessGroupNCCL).
  void allReduce(const Args& a, void* stream);
  void reduceScatter(const Args& a, void* stream);
  void allGather(const Args& a, void* stream);
  void broadcast(const Args& a, void* stream);
  // Into local rank a.root's `out`.
  void reduce(const Args& a, void* stream);
  // After a failure (the group timed out or was aborted): NCCL's kernels
  // stop, and the communicator is unusable. Safe from any thread; the
  // first call aborts.
  void abort() noexcept;
  // NCCL's asynchronous error ("" if none, or aborted): a peer's failure
  // NCCL noticed. Safe from any thread (the stream watch's probe).
  std::string asyncError() const;

 private:
  // Before NCCL's collective `name` on a's buffers: a's dtype and op in
  // NCCL's terms (InvalidArgument where it has none), not aborted, counted.
  struct Call {
    std::string what;  // "<the communicator>: <name>", for its error
    int dt = 0, op = 0;
  };
  Call startCall(const Args& a, const char* name) const;

  const NcclLibrary& lib_;
  NcclLibrary::Comm comm_ = nullptr;
  std::string what_;  // "NCCL communicator of <prefix> (local rank r of n)"
  // abort() frees comm_: the query and the abort never overlap (mu_), and
  // no call starts after an abort (aborted_).
  mutable std::mutex mu_;
  std::atomic<bool> aborted_{false};
};

}  // namespace smdccl
