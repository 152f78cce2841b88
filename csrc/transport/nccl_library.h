#pragma once
// NCCL, loaded at run time (dlopen): the intra-node engine for CUDA tensors
// where every rank of a node has a GPU of its own. No build-time dependency:
// torch's CUDA wheels install libnccl.so.2 (nvidia/nccl/lib) and torch has
// it loaded by the time a group exists; a machine without it gets a clear
// reason and smdccl's own CUDA-IPC path. The few types and constants used
// are NCCL's stable ABI, declared here (nccl.h is not needed to build).
// Torch- and CUDA-free: streams and device pointers pass as void*.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/deadline.h"
#include "common/dtype.h"
#include "common/store.h"

namespace smdccl {

// ncclUniqueId: 128 opaque bytes, made by one rank and handed to the others.
struct NcclUniqueId {
  char bytes[128];
};

class NcclLibrary;

// The unique id of a communicator, from its rank 0 to the others through
// the store under `key`: rank 0 makes it (lib.uniqueId()) and publishes it;
// the others wait for it until `deadline` (a CommError naming the key then).
NcclUniqueId shareNcclId(const NcclLibrary& lib, KVStore& store, const std::string& key,
                         int rank, Deadline deadline);
// As a store value (hex) and back (InvalidArgument if malformed).
std::string encodeNcclId(const NcclUniqueId& id);
NcclUniqueId decodeNcclId(const std::string& s);

class NcclLibrary {
 public:
  // The process's NCCL, loaded at the first call (SMDCCL_NCCL_LIBRARY, else
  // libnccl.so.2 as the dynamic loader finds it: torch's copy once torch is
  // imported). nullptr where it cannot be loaded; `why` then says why.
  static const NcclLibrary* get(std::string* why = nullptr);
  // Loads `path` (for tests and tools; get() caches its own).
  static const NcclLibrary* load(const std::string& path, std::string* why);

  // "2.28.9".
  std::string versionString() const;
  int version() const { return version_; }  // NCCL_VERSION_CODE: 22809
  const std::string& path() const { return path_; }
  // A fresh ncclUniqueId (no GPU needed).
  NcclUniqueId uniqueId() const;

  // NCCL's data type for dt; false where NCCL has none (bool, complex):
  // such tensors take another path.
  static bool dataType(DType dt, int* nccl);
  // NCCL's reduction for op; false for the bitwise ops.
  static bool redOp(RedOp op, int* nccl);

  // The entry points, NCCL's signatures with opaque handles. Each returns
  // ncclResult_t (0: success); check() turns a failure into a CommError.
  using Comm = void*;
  int (*commInitRank)(Comm* comm, int nranks, NcclUniqueId id, int rank) = nullptr;
  int (*commDestroy)(Comm comm) = nullptr;
  int (*commAbort)(Comm comm) = nullptr;
  int (*commGetAsyncError)(Comm comm, int* asyncError) = nullptr;
  int (*allReduce)(const void* send, void* recv, size_t count, int dt, int op, Comm comm,
                   void* stream) = nullptr;
  int (*reduceScatter)(const void* send, void* recv, size_t recvCount, int dt, int op, Comm comm,
                       void* stream) = nullptr;
  int (*allGather)(const void* send, void* recv, size_t sendCount, int dt, Comm comm,
                   void* stream) = nullptr;
  int (*broadcast)(const void* send, void* recv, size_t count, int dt, int root, Comm comm,
                   void* stream) = nullptr;
  int (*reduce)(const void* send, void* recv, size_t count, int dt, int op, int root, Comm comm,
                void* stream) = nullptr;
  // Throws CommError "smdccl: <what>: NCCL error <n> (<NCCL's string>)" unless result is 0.
  void check(int result, const std::string& what) const;

 private:
  NcclLibrary() = default;
  std::string path_;
  int version_ = 0;
  int (*getVersion_)(int* version) = nullptr;
  int (*getUniqueId_)(NcclUniqueId* id) = nullptr;
  const char* (*getErrorString_)(int result) = nullptr;
};

}  // namespace smdccl
