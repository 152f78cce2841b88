#include "transport/cuda/nccl_comm.h"

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/error.h"
#include "common/log.h"
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

void NcclNodeComm::checkNotAborted(const char* call) const {
  if (aborted_.load())
    throw CommError(
        CommError::Kind::System,
        strCat("smdccl: ", what_, ": ", call,
               " after the communicator was aborted (the group failed or was aborted)"));
}

namespace {
// NCCL's forms of a.dt and a.op (InvalidArgument where it has none).
void types(const NcclNodeComm::Args& a, int* ndt, int* nop, const std::string& what) {
  SMDCCL_CHECK_ARG(NcclLibrary::dataType(a.dt, ndt), "smdccl: ", what, ": NCCL has no such dtype");
  SMDCCL_CHECK_ARG(NcclLibrary::redOp(a.op, nop), "smdccl: ", what, ": NCCL has no such reduction");
}
}  // namespace

void NcclNodeComm::allReduce(const Args& a, void* stream) {
  int ndt = 0, nop = 0;
  types(a, &ndt, &nop, what_);
  checkNotAborted("ncclAllReduce");
  countCudaCall();
  lib_.check(lib_.allReduce(a.in, a.out, a.count, ndt, nop, comm_, stream), what_ + ": ncclAllReduce");
}

void NcclNodeComm::reduceScatter(const Args& a, void* stream) {
  int ndt = 0, nop = 0;
  types(a, &ndt, &nop, what_);
  checkNotAborted("ncclReduceScatter");
  countCudaCall();
  lib_.check(lib_.reduceScatter(a.in, a.out, a.count, ndt, nop, comm_, stream),
             what_ + ": ncclReduceScatter");
}

void NcclNodeComm::allGather(const Args& a, void* stream) {
  int ndt = 0, nop = 0;
  types(a, &ndt, &nop, what_);
  checkNotAborted("ncclAllGather");
  countCudaCall();
  lib_.check(lib_.allGather(a.in, a.out, a.count, ndt, comm_, stream), what_ + ": ncclAllGather");
}

void NcclNodeComm::broadcast(const Args& a, void* stream) {
  int ndt = 0, nop = 0;
  types(a, &ndt, &nop, what_);
  checkNotAborted("ncclBroadcast");
  countCudaCall();
  lib_.check(lib_.broadcast(a.in, a.out, a.count, ndt, a.root, comm_, stream),
             what_ + ": ncclBroadcast");
}

void NcclNodeComm::reduce(const Args& a, void* stream) {
  int ndt = 0, nop = 0;
  types(a, &ndt, &nop, what_);
  checkNotAborted("ncclReduce");
  countCudaCall();
  lib_.check(lib_.reduce(a.in, a.out, a.count, ndt, nop, a.root, comm_, stream),
             what_ + ": ncclReduce");
}

}  // namespace smdccl
