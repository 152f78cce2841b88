#include "backend/group_children.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdio>

#include "backend/backend.h"
#include "common/hash.h"
#include "backend/gil.h"
#include "backend/arg_checks.h"
#include "common/error.h"
#include "common/log.h"

namespace smdccl {

c10::intrusive_ptr<::c10d::Store> incarnationStore(const c10::intrusive_ptr<::c10d::Store>& store,
                                                   const BackendConfig& cfg) {
  Fnv1a members;  // of the members' global ranks
  members.mix(static_cast<uint64_t>(cfg.size));
  for (int r = 0; r < cfg.size; ++r)
    members.mix(static_cast<uint64_t>(
        cfg.globalRanks.empty() ? r : cfg.globalRanks[static_cast<size_t>(r)]));
  char tag[17];
  std::snprintf(tag, sizeof tag, "%016llx", static_cast<unsigned long long>(members.value));
  int64_t joined = store->add(strCat("smdccl/joined/", tag, "/", cfg.rank), 1);
  return c10::make_intrusive<::c10d::PrefixStore>(strCat("smdccl/", tag, "/", joined - 1), store);
}

void GroupChildren::checkRank(const char* api, int64_t r) const {
  SMDCCL_CHECK_ARG(r >= 0 && r < parent_.size, api, ": rank ", r, " is not a rank of group '",
                   parent_.groupName, "' (its ranks are 0..", parent_.size - 1, ")");
}

BackendConfig GroupChildren::childConfig(const std::vector<int>& ranks, std::string name,
                                         const c10::intrusive_ptr<Options>& opts) const {
  BackendConfig child;
  child.rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), parent_.rank) - ranks.begin());
  child.size = static_cast<int>(ranks.size());
  child.groupName = std::move(name);
  for (int r : ranks) child.globalRanks.push_back(parent_.globalRanks[r]);
  child.timeout = opts && opts->timeout.count() > 0 ? opts->timeout : timeout_();
  child.masterAddr = parent_.masterAddr;
  child.worldSize = parent_.worldSize;
  child.wire = parent_.wire;
  child.wireIntra = parent_.wireIntra;
  child.int8 = parent_.int8;
  return child;
}

c10::intrusive_ptr<::c10d::Backend> GroupChildren::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> seen;
  for (int r : ranks) {
    checkRank("split_group", r);
    SMDCCL_CHECK_ARG(std::find(seen.begin(), seen.end(), r) == seen.end(), "split_group: rank ", r,
                     " is listed twice");
    seen.push_back(r);
  }
  auto mine = std::find(ranks.begin(), ranks.end(), parent_.rank);
  if (mine == ranks.end()) return {};  // not a member: torch returns NON_GROUP_MEMBER
  // The same child for each device type of one split (same store object).
  if (auto child = splits_.find(store.get())) return child;
  BackendConfig child =
      childConfig(ranks,
                  opts && !opts->group_name.empty()
                      ? opts->group_name
                      : strCat(parent_.groupName, ":split:", ranks.size(), "@", ranks.front()),
                  opts);
  c10::intrusive_ptr<SmdcclBackend> backend;
  {
    GilReleasedIfHeld released;  // construction rendezvouses through the store
    backend = c10::make_intrusive<SmdcclBackend>(store, std::move(child));
  }
  splits_.remember(store.get(), backend);
  return backend;
}

c10::intrusive_ptr<::c10d::Backend> GroupChildren::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& opts, const std::function<void()>& abortParent) {
  const int size = parent_.size;
  const int rank = parent_.rank;
  constexpr int kShrinkAbort = 1;  // torch.distributed.SHRINK_ABORT
  SMDCCL_CHECK_ARG(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, "shrink_group: shrink_flags ",
                   shrinkFlags, " is neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  std::vector<bool> excluded(static_cast<size_t>(size), false);
  for (int64_t r : ranksToExclude) {
    checkRank("shrink_group", r);
    excluded[static_cast<size_t>(r)] = true;
  }
  SMDCCL_CHECK_ARG(!excluded[static_cast<size_t>(rank)], "shrink_group: rank ", rank,
                   " is one of the ranks to exclude; only the remaining ranks call shrink_group");
  std::vector<int> remaining;
  for (int r = 0; r < size; ++r)
    if (!excluded[static_cast<size_t>(r)]) remaining.push_back(r);
  uint64_t n = ++shrinks_;
  BackendConfig child =
      childConfig(remaining,
                  opts && !opts->group_name.empty()
                      ? opts->group_name
                      : strCat(parent_.groupName, ":shrunk", n > 1 ? strCat(n) : ""),
                  opts);
  if (shrinkFlags == kShrinkAbort) abortParent();
  auto store = c10::make_intrusive<::c10d::PrefixStore>(strCat("smdccl/shrink/", n), store_);
  GilReleasedIfHeld released;  // construction rendezvouses through the store
  return c10::make_intrusive<SmdcclBackend>(store, std::move(child));
}

}  // namespace smdccl
