#pragma once
// A group's lifecycle beyond itself: the keys of its incarnation, and the
// groups that split() and shrink() make of some of its ranks, with its
// settings (compression, timeout, address hint).
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <vector>

#include "backend/backend_config.h"
#include "backend/split_children.h"

namespace smdccl {

// The keys of this incarnation of the group. A group re-created under the
// same name on a store that outlived the first one (destroy_process_group()
// then init_process_group() on torchrun's agent store, or on a store the
// caller passes again) would otherwise read the earlier one's keys: its
// token, addresses, shared-memory names, recorded failure. Each rank counts
// its joins of groups with this name and these members (torch reuses names,
// also for other members or sizes); the count is the incarnation's prefix,
// the same on its ranks as each of them joins each incarnation once.
c10::intrusive_ptr<::c10d::Store> incarnationStore(const c10::intrusive_ptr<::c10d::Store>& store,
                                                   const BackendConfig& cfg);

class GroupChildren {
 public:
  using Options = ::c10d::Backend::Options;
  // The parent's config (read at each call: its rank, members, settings),
  // its incarnation store (shrink()'s children live under it) and its
  // current timeout.
  GroupChildren(const BackendConfig& parent, const c10::intrusive_ptr<::c10d::Store>& store,
                std::function<std::chrono::milliseconds()> timeout)
      : parent_(parent), store_(store), timeout_(std::move(timeout)) {}

  // dist.split_group() / new_group() on a group bound to a device: the
  // child of `ranks` built over `store`, the same one for each device type
  // torch splits with that store; nullptr where this rank is not in `ranks`.
  c10::intrusive_ptr<::c10d::Backend> split(const c10::intrusive_ptr<::c10d::Store>& store,
                                            const std::vector<int>& ranks,
                                            const c10::intrusive_ptr<Options>& opts);
  // dist.shrink_group(): the child of the ranks not excluded, over a
  // namespace of the parent's store that they agree on (their count of
  // shrinks). SHRINK_ABORT (1) calls `abortParent` first, after the checks.
  c10::intrusive_ptr<::c10d::Backend> shrink(const std::vector<int64_t>& ranksToExclude,
                                             int shrinkFlags,
                                             const c10::intrusive_ptr<Options>& opts,
                                             const std::function<void()>& abortParent);

 private:
  // ValueError unless `r` is a rank of the parent.
  void checkRank(const char* api, int64_t r) const;
  // The config of a child of the parent's `ranks` (in child-rank order;
  // this rank is one of them) named `name`, with the parent's compression
  // and `opts`' timeout, if any.
  BackendConfig childConfig(const std::vector<int>& ranks, std::string name,
                            const c10::intrusive_ptr<Options>& opts) const;

  const BackendConfig& parent_;
  c10::intrusive_ptr<::c10d::Store> store_;
  std::function<std::chrono::milliseconds()> timeout_;
  SplitChildren splits_;  // by the store torch handed them
  std::atomic<uint64_t> shrinks_{0};
};

}  // namespace smdccl
