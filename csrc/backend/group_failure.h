#pragma once
// The group's first failure, recorded in the store by the first rank whose
// collective failed the group (or that aborted it); later ranks name it in
// their errors, and a connection wait asks for it (GroupFailureProbe).
#include <torch/csrc/distributed/c10d/Backend.hpp>  // c10d::ErrorType

#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "common/error.h"
#include "common/store.h"

namespace smdccl {

extern const char* const kFirstFailureKey;

// The recorded first failure, or "" while the group has none.
std::string recordedFirstFailure(KVStore& store);
// `mine` with the group's first failure: records `mine` as that when no
// rank has recorded one yet; otherwise appends the recorded one (unless it
// is `mine`). Store errors are logged, not raised.
std::string withFirstFailure(KVStore& store, const std::string& mine);

// Whether the group can still run collectives: once one fails the group (or
// abort() is called) every later op fails fast with that error.
// Thread-safe.
class GroupFate {
 public:
  // The error later ops fail with (nullptr: the group is usable).
  std::exception_ptr fatal() const;
  // What getError() reports.
  ::c10d::ErrorType errorType() const;
  // abort()'s cause, "" until abort() is called.
  std::string abortCause() const;
  // Records abort()'s `cause` and, unless an earlier failure is the group's
  // error, `err`; false when abort() was already called.
  bool abort(const std::string& cause, std::exception_ptr err);
  // A collective failed the group with `err` (its kind sets errorType()).
  void fail(std::exception_ptr err, CommError::Kind kind);

 private:
  mutable std::mutex mu_;
  std::exception_ptr fatal_;
  std::string abortCause_;
  ::c10d::ErrorType errorType_ = ::c10d::ErrorType::SUCCESS;
};

// MeshConfig::groupFailed: the recorded first failure, read from the store
// at most twice a second (it is asked on every slice of a connection wait).
class GroupFailureProbe {
 public:
  explicit GroupFailureProbe(std::shared_ptr<KVStore> store) : store_(std::move(store)) {}
  std::string operator()();

 private:
  std::shared_ptr<KVStore> store_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point next_{};
  std::chrono::milliseconds interval_{500};
  std::string found_;
};

}  // namespace smdccl
