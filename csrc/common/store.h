#pragma once
// The key-value store the torch-free layers rendezvous through. The backend
// adapts torch's c10d::Store (already prefixed per group) to it.
#include <cstdint>
#include <string>
#include <vector>

#include "common/deadline.h"

namespace smdccl {

class KVStore {
 public:
  virtual ~KVStore() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists or the deadline passes (then throws CommError).
  virtual std::string get(const std::string& key, Deadline deadline) = 0;
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Whether the key exists, without waiting.
  virtual bool check(const std::string& key) = 0;
  // Deletes the key if it exists (cleanup of keys nobody reads any more).
  virtual void remove(const std::string& key) = 0;
};

// One round over the store: `size` ranks meet under `prefix`, each waiting
// until `deadline`.
struct StoreRound {
  std::string prefix;
  int rank;
  int size;
  Deadline deadline;
};
// Every rank publishes `value` under prefix/rank and reads everyone's.
std::vector<std::string> allGatherStrings(KVStore& store, const StoreRound& round,
                                          const std::string& value);

// Blocks until all `size` ranks have reached the barrier named `name`.
void storeBarrier(KVStore& store, const std::string& name, int size, Deadline deadline);

}  // namespace smdccl
