#pragma once
// KVStore over torch's c10d::Store (already prefixed with the group's name).
#include <cstdint>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "common/error.h"
#include "common/store.h"

namespace smdccl {

class C10dStoreAdapter : public KVStore {
 public:
  explicit C10dStoreAdapter(c10::intrusive_ptr<::c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }

  std::string get(const std::string& key, Deadline deadline) override {
    try {
      store_->wait({key}, std::max(deadline.remaining(), std::chrono::milliseconds(1)));
    } catch (const c10::Error& e) {  // torch's message, without its C++ backtrace
      throw CommError(CommError::Kind::Timeout, strCat("smdccl: waiting for store key '", key,
                                                       "' failed: ", e.what_without_backtrace()));
    } catch (const std::exception& e) {
      throw CommError(CommError::Kind::Timeout,
                      strCat("smdccl: waiting for store key '", key, "' failed: ", e.what()));
    }
    auto v = store_->get(key);
    return std::string(v.begin(), v.end());
  }

  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }

  bool check(const std::string& key) override { return store_->check({key}); }

  void remove(const std::string& key) override { store_->deleteKey(key); }

 private:
  c10::intrusive_ptr<::c10d::Store> store_;
};

}  // namespace smdccl
