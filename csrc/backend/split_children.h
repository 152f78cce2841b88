#pragma once
// split()'s children, by the store torch handed them: torch splits a group
// once per device type with one store, and every call must get the same
// child. A child that is gone no longer holds its store, whose address may
// then be reused: the entry is dropped. Thread-safe.
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <algorithm>
#include <mutex>
#include <utility>
#include <vector>

namespace smdccl {

class SplitChildren {
 public:
  // The live child made with `store`, or null.
  c10::intrusive_ptr<::c10d::Backend> find(const ::c10d::Store* store) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [s, weak] : children_)
      if (s == store)
        if (auto child = weak.lock()) return child;
    children_.erase(std::remove_if(children_.begin(), children_.end(),
                                   [](const auto& e) { return e.second.expired(); }),
                    children_.end());
    return {};
  }
  void remember(const ::c10d::Store* store, const c10::intrusive_ptr<::c10d::Backend>& child) {
    std::lock_guard<std::mutex> lock(mu_);
    children_.emplace_back(store, c10::weak_intrusive_ptr<::c10d::Backend>(child));
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<const ::c10d::Store*, c10::weak_intrusive_ptr<::c10d::Backend>>> children_;
};

}  // namespace smdccl
