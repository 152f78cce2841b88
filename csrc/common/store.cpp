#include "common/store.h"

namespace smdccl {

std::vector<std::string> allGatherStrings(KVStore& store, const std::string& prefix, int rank,
                                          int size, const std::string& value, Deadline deadline) {
  store.set(prefix + "/" + std::to_string(rank), value);
  std::vector<std::string> out(size);
  for (int r = 0; r < size; ++r)
    out[r] = (r == rank) ? value : store.get(prefix + "/" + std::to_string(r), deadline);
  return out;
}

void storeBarrier(KVStore& store, const std::string& name, int size, Deadline deadline) {
  int64_t arrived = store.add(name + "/count", 1);
  if (arrived == size) store.set(name + "/done", "1");
  store.get(name + "/done", deadline);
}

}  // namespace smdccl
