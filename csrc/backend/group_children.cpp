// SmdcclBackend's children: split() and shrink() make groups of some of its
// ranks, with this group's settings.
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include "backend/backend.h"
#include "backend/gil.h"
#include "backend/tensor_checks.h"
#include "common/error.h"
#include "common/log.h"

namespace smdccl {

void SmdcclBackend::checkRankOfGroup(const char* api, int64_t r) const {
  SMDCCL_CHECK_ARG(r >= 0 && r < size_, api, ": rank ", r, " is not a rank of group '",
                   cfg_.groupName, "' (its ranks are 0..", size_ - 1, ")");
}

BackendConfig SmdcclBackend::childConfig(const std::vector<int>& ranks, std::string name,
                                         const c10::intrusive_ptr<Options>& opts) const {
  BackendConfig child;
  child.rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  child.size = static_cast<int>(ranks.size());
  child.groupName = std::move(name);
  for (int r : ranks) child.globalRanks.push_back(cfg_.globalRanks[r]);
  child.timeout = opts && opts->timeout.count() > 0 ? opts->timeout
                                                    : std::chrono::milliseconds(timeoutMs_.load());
  child.masterAddr = cfg_.masterAddr;
  child.worldSize = cfg_.worldSize;
  child.wire = cfg_.wire;
  child.wireIntra = cfg_.wireIntra;
  return child;
}

c10::intrusive_ptr<::c10d::Backend> SmdcclBackend::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> seen;
  for (int r : ranks) {
    checkRankOfGroup("split_group", r);
    SMDCCL_CHECK_ARG(std::find(seen.begin(), seen.end(), r) == seen.end(), "split_group: rank ", r,
                     " is listed twice");
    seen.push_back(r);
  }
  auto mine = std::find(ranks.begin(), ranks.end(), rank_);
  if (mine == ranks.end()) return {};  // not a member: torch returns NON_GROUP_MEMBER
  // The same child for each device type of one split (same store object).
  if (auto child = splitChildren_.find(store.get())) return child;
  BackendConfig child =
      childConfig(ranks,
                  opts && !opts->group_name.empty()
                      ? opts->group_name
                      : strCat(cfg_.groupName, ":split:", ranks.size(), "@", ranks.front()),
                  opts);
  c10::intrusive_ptr<SmdcclBackend> backend;
  {
    GilReleasedIfHeld released;  // construction rendezvouses through the store
    backend = c10::make_intrusive<SmdcclBackend>(store, std::move(child));
  }
  splitChildren_.remember(store.get(), backend);
  return backend;
}

c10::intrusive_ptr<::c10d::Backend> SmdcclBackend::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& opts) {
  constexpr int kShrinkAbort = 1;  // torch.distributed.SHRINK_ABORT
  SMDCCL_CHECK_ARG(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, "shrink_group: shrink_flags ",
                   shrinkFlags, " is neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  std::vector<bool> excluded(static_cast<size_t>(size_), false);
  for (int64_t r : ranksToExclude) {
    checkRankOfGroup("shrink_group", r);
    excluded[static_cast<size_t>(r)] = true;
  }
  SMDCCL_CHECK_ARG(!excluded[static_cast<size_t>(rank_)], "shrink_group: rank ", rank_,
                   " is one of the ranks to exclude; only the remaining ranks call shrink_group");
  std::vector<int> remaining;
  for (int r = 0; r < size_; ++r)
    if (!excluded[static_cast<size_t>(r)]) remaining.push_back(r);
  uint64_t n = ++shrinks_;
  BackendConfig child = childConfig(remaining,
                                    opts && !opts->group_name.empty()
                                        ? opts->group_name
                                        : strCat(cfg_.groupName, ":shrunk", n > 1 ? strCat(n) : ""),
                                    opts);
  if (shrinkFlags == kShrinkAbort) abort();
  auto store = c10::make_intrusive<::c10d::PrefixStore>(strCat("smdccl/shrink/", n), c10dStore_);
  GilReleasedIfHeld released;  // construction rendezvouses through the store
  return c10::make_intrusive<SmdcclBackend>(store, std::move(child));
}

}  // namespace smdccl
