#include "transport/nccl_library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>

#include "common/env.h"
#include "common/hex.h"
#include "common/error.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_TEXT(kNcclLibrary, "SMDCCL_NCCL_LIBRARY", "",
                "The NCCL library smdccl loads for its intra-node CUDA engine (a path to "
                "libnccl.so.2). Unset: libnccl.so.2 as the dynamic loader finds it, which is "
                "torch's own copy once torch is imported.");
}  // namespace env

namespace {

// NCCL's ABI constants (nccl.h): ncclDataType_t and ncclRedOp_t.
constexpr int kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclInt64 = 4, kNcclFloat16 = 6,
              kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9;
constexpr int kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3;
// bfloat16 arrived in NCCL 2.10 (version code 21000).
constexpr int kBfloat16Since = 21000;

template <typename F>
bool bind(void* handle, const char* name, F* fn, std::string* missing) {
  *fn = reinterpret_cast<F>(dlsym(handle, name));
  if (!*fn) *missing += strCat(missing->empty() ? "" : ", ", name);
  return *fn != nullptr;
}

}  // namespace

const NcclLibrary* NcclLibrary::load(const std::string& path, std::string* why) {
  // RTLD_LOCAL: its symbols stay out of the global namespace; torch's own
  // handle to the same file (if loaded) is shared, not a second copy.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* err = dlerror();
    if (why) *why = strCat("cannot load ", path, ": ", err ? err : "unknown error");
    return nullptr;
  }
  std::unique_ptr<NcclLibrary> lib(new NcclLibrary);
  std::string missing;
  bind(handle, "ncclGetVersion", &lib->getVersion_, &missing);
  bind(handle, "ncclGetUniqueId", &lib->getUniqueId_, &missing);
  bind(handle, "ncclGetErrorString", &lib->getErrorString_, &missing);
  bind(handle, "ncclCommInitRank", &lib->commInitRank, &missing);
  bind(handle, "ncclCommDestroy", &lib->commDestroy, &missing);
  bind(handle, "ncclCommAbort", &lib->commAbort, &missing);
  bind(handle, "ncclCommGetAsyncError", &lib->commGetAsyncError, &missing);
  bind(handle, "ncclAllReduce", &lib->allReduce, &missing);
  bind(handle, "ncclReduceScatter", &lib->reduceScatter, &missing);
  bind(handle, "ncclAllGather", &lib->allGather, &missing);
  bind(handle, "ncclBroadcast", &lib->broadcast, &missing);
  bind(handle, "ncclReduce", &lib->reduce, &missing);
  if (!missing.empty()) {
    if (why) *why = strCat(path, " is not a usable NCCL (missing ", missing, ")");
    dlclose(handle);
    return nullptr;
  }
  Dl_info info{};
  lib->path_ = dladdr(reinterpret_cast<void*>(lib->getVersion_), &info) && info.dli_fname
                   ? info.dli_fname
                   : path;
  if (lib->getVersion_(&lib->version_) != 0) {
    if (why) *why = strCat(lib->path_, ": ncclGetVersion failed");
    dlclose(handle);
    return nullptr;
  }
  // The handle stays open for the process's life: NCCL's own threads and
  // the communicators made with it may outlive any one group.
  return lib.release();
}

const NcclLibrary* NcclLibrary::get(std::string* why) {
  static std::once_flag once;
  static const NcclLibrary* lib = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    const std::string set = envString(env::kNcclLibrary);
    lib = load(set.empty() ? "libnccl.so.2" : set, &reason);
    if (!lib && set.empty())
      reason += " (torch's CUDA builds ship it as nvidia/nccl/lib/libnccl.so.2; "
                "SMDCCL_NCCL_LIBRARY names another)";
  });
  if (!lib && why) *why = reason;
  return lib;
}

std::string NcclLibrary::versionString() const {
  // NCCL >= 2.9 codes versions as major * 10000 + minor * 100 + patch.
  return strCat(version_ / 10000, ".", version_ / 100 % 100, ".", version_ % 100);
}

NcclUniqueId NcclLibrary::uniqueId() const {
  NcclUniqueId id{};
  check(getUniqueId_(&id), "ncclGetUniqueId");
  return id;
}

void NcclLibrary::check(int result, const std::string& what) const {
  if (result == 0) return;
  const char* text = getErrorString_ ? getErrorString_(result) : nullptr;
  throw CommError(CommError::Kind::System, strCat("smdccl: ", what, ": NCCL error ", result, " (",
                                                  text ? text : "unknown", ")"));
}

std::string encodeNcclId(const NcclUniqueId& id) { return toHex(id.bytes, sizeof(id.bytes)); }

NcclUniqueId decodeNcclId(const std::string& s) {
  NcclUniqueId id{};
  const bool ok = fromHex(s, id.bytes, sizeof(id.bytes));
  SMDCCL_CHECK_ARG(ok, "smdccl: a malformed NCCL unique id in the store (", s.size(), " characters)");
  return id;
}

NcclUniqueId shareNcclId(const NcclLibrary& lib, KVStore& store, const std::string& key, int rank,
                         Deadline deadline) {
  if (rank == 0) {
    NcclUniqueId id = lib.uniqueId();
    store.set(key, encodeNcclId(id));
    return id;
  }
  return decodeNcclId(store.get(key, deadline));
}

bool NcclLibrary::dataType(DType dt, int* nccl) {
  static const std::map<DType, int> types = {
      {DType::F32, kNcclFloat32}, {DType::F64, kNcclFloat64}, {DType::F16, kNcclFloat16},
      {DType::BF16, kNcclBfloat16}, {DType::I8, kNcclInt8},   {DType::I32, kNcclInt32},
      {DType::I64, kNcclInt64},     {DType::U8, kNcclUint8}};
  auto it = types.find(dt);
  if (it == types.end()) return false;
  if (dt == DType::BF16) {
    const NcclLibrary* lib = get();
    if (!lib || lib->version() < kBfloat16Since) return false;
  }
  *nccl = it->second;
  return true;
}

bool NcclLibrary::redOp(RedOp op, int* nccl) {
  switch (op) {
    case RedOp::Sum: *nccl = kNcclSum; return true;
    case RedOp::Prod: *nccl = kNcclProd; return true;
    case RedOp::Max: *nccl = kNcclMax; return true;
    case RedOp::Min: *nccl = kNcclMin; return true;
    default: return false;
  }
}

}  // namespace smdccl
