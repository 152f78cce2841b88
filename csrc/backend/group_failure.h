#pragma once
// The group's first failure, recorded in the store by the first rank whose
// collective failed the group (or that aborted it); later ranks name it in
// their errors, and a connection wait asks for it (GroupFailureProbe).
#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "common/store.h"

namespace smdccl {

extern const char* const kFirstFailureKey;

// The recorded first failure, or "" while the group has none.
std::string recordedFirstFailure(KVStore& store);

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
