#include "common/store.h"

#include "common/error.h"
#include <cstdint>

namespace smdccl {

std::vector<std::string> allGatherStrings(KVStore& store, const StoreRound& round,
                                          const std::string& value) {
  const std::string& prefix = round.prefix;
  const int rank = round.rank, size = round.size;
  const Deadline deadline = round.deadline;
  store.set(prefix + "/" + std::to_string(rank), value);
  std::vector<std::string> out(size);
  for (int r = 0; r < size; ++r) {
    if (r == rank) {
      out[r] = value;
      continue;
    }
    try {
      out[r] = store.get(prefix + "/" + std::to_string(r), deadline);
    } catch (const CommError& e) {
      throw CommError(e.kind(),
                      strCat("rank ", r, " of ", size, " did not arrive (", e.what(), ")"));
    }
  }
  return out;
}

void storeBarrier(KVStore& store, const std::string& name, int size, Deadline deadline) {
  int64_t arrived = store.add(name + "/count", 1);
  if (arrived == size) store.set(name + "/done", "1");
  store.get(name + "/done", deadline);
}

}  // namespace smdccl
