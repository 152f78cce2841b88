#include "transport/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/log.h"
#include "common/own_thread.h"
#include "transport/cuda/capture_mode.h"
#include "transport/cuda/cuda_check.h"

namespace smdccl {

namespace {

// ncclCommInitRank's outcome, shared with the thread that runs it: the
// caller may give up at its deadline and leave; the thread then destroys
// what it made.
struct InitState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false, abandoned = false;
  int result = 0;
  std::string cudaError;
  NcclLibrary::Comm comm = nullptr;
};

}  // namespace

NcclNodeComm::NcclNodeComm(const NcclLibrary& lib, KVStore& store, const Spec& s,
                           Deadline deadline)
    : lib_(lib),
      what_(strCat("the NCCL communicator of ", s.keyPrefix, " (local rank ", s.localRank, " of ",
                   s.localSize, ")")) {
  const NcclUniqueId id =
      shareNcclId(lib, store, s.keyPrefix + "/nccl_id", s.localRank, deadline);
  auto st = std::make_shared<InitState>();
  const NcclLibrary* l = &lib;
  std::thread([st, l, id, s] {
    // Its CUDA calls (NCCL's allocations) must not break a graph another
    // thread captures, as an async first collective's init may overlap one.
    markOwnThread("smdccl-ncclinit");  // 15 characters at most
    CaptureSafeScope captureSafe;
    NcclLibrary::Comm comm = nullptr;
    int result = 0;
    std::string cudaError;
    cudaError_t e = cudaSetDevice(s.device);
    if (e != cudaSuccess) cudaError = cudaGetErrorString(e);
    else result = l->commInitRank(&comm, s.localSize, id, s.localRank);
    std::lock_guard<std::mutex> lock(st->mu);
    if (st->abandoned) {
      if (comm) l->commDestroy(comm);
      return;
    }
    st->done = true;
    st->result = result;
    st->cudaError = cudaError;
    st->comm = comm;
    st->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lock(st->mu);
  if (!st->cv.wait_until(lock, deadline.at(), [&] { return st->done; })) {
    st->abandoned = true;
    throw CommError(CommError::Kind::Timeout,
                    strCat("smdccl: ", what_,
                           ": timed out in ncclCommInitRank waiting for the node's other ranks "
                           "(has every rank of the node called the same CUDA collective?)"));
  }
  if (!st->cudaError.empty())
    throw CommError(CommError::Kind::System,
                    strCat("smdccl: ", what_, ": cudaSetDevice(", s.device, "): ", st->cudaError));
  lib.check(st->result, strCat(what_, ": ncclCommInitRank"));
  comm_ = st->comm;
  SMDCCL_INFO("CUDA collectives inside the node run on NCCL ", lib.versionString(), " (",
              lib.path(), "), ", what_);
}

NcclNodeComm::~NcclNodeComm() {
  if (comm_ && !aborted_.load()) lib_.commDestroy(comm_);
}

void NcclNodeComm::abort() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (!comm_ || aborted_.exchange(true)) return;
  lib_.commAbort(comm_);
}

std::string NcclNodeComm::asyncError() const {
  std::lock_guard<std::mutex> lock(mu_);
  int err = 0;
  if (!comm_ || aborted_.load() || lib_.commGetAsyncError(comm_, &err) != 0 || err == 0) return "";
  return strCat("NCCL reports error ", err, " on ", what_);
}

NcclNodeComm::Call NcclNodeComm::startCall(const Args& a, const char* name) const {
  Call c{.what = strCat(what_, ": ", name)};
  SMDCCL_CHECK_ARG(NcclLibrary::dataType(a.dt, &c.dt), "smdccl: ", what_,
                   ": NCCL has no such dtype");
  SMDCCL_CHECK_ARG(NcclLibrary::redOp(a.op, &c.op), "smdccl: ", what_,
                   ": NCCL has no such reduction");
  if (aborted_.load())
    throw CommError(
        CommError::Kind::System,
        strCat("smdccl: ", c.what,
               " after the communicator was aborted (the group failed or was aborted)"));
  countCudaCall();
  return c;
}

void NcclNodeComm::allReduce(const Args& a, void* stream) {
  const Call c = startCall(a, "ncclAllReduce");
  lib_.check(lib_.allReduce(a.in, a.out, a.count, c.dt, c.op, comm_, stream), c.what);
}

void NcclNodeComm::reduceScatter(const Args& a, void* stream) {
  const Call c = startCall(a, "ncclReduceScatter");
  lib_.check(lib_.reduceScatter(a.in, a.out, a.count, c.dt, c.op, comm_, stream), c.what);
}

void NcclNodeComm::allGather(const Args& a, void* stream) {
  const Call c = startCall(a, "ncclAllGather");
  lib_.check(lib_.allGather(a.in, a.out, a.count, c.dt, comm_, stream), c.what);
}

void NcclNodeComm::broadcast(const Args& a, void* stream) {
  const Call c = startCall(a, "ncclBroadcast");
  lib_.check(lib_.broadcast(a.in, a.out, a.count, c.dt, a.root, comm_, stream), c.what);
}

void NcclNodeComm::reduce(const Args& a, void* stream) {
  const Call c = startCall(a, "ncclReduce");
  lib_.check(lib_.reduce(a.in, a.out, a.count, c.dt, c.op, a.root, comm_, stream), c.what);
}

}  // namespace smdccl
