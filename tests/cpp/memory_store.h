#pragma once
// A KVStore in this process's memory, for tests whose "ranks" are threads.
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "common/error.h"
#include "common/store.h"

class MemoryStore : public smdccl::KVStore {
 public:
  void set(const std::string& k, const std::string& v) override {
    std::lock_guard<std::mutex> l(mu_);
    kv_[k] = v;
    cv_.notify_all();
  }
  std::string get(const std::string& k, smdccl::Deadline d) override {
    std::unique_lock<std::mutex> l(mu_);
    if (!cv_.wait_until(l, d.at(), [&] { return kv_.count(k) > 0; }))
      throw smdccl::CommError(smdccl::CommError::Kind::Timeout, "store timeout " + k);
    return kv_[k];
  }
  bool check(const std::string& k) override {
    std::lock_guard<std::mutex> l(mu_);
    return kv_.count(k) > 0;
  }
  void remove(const std::string& k) override {
    std::lock_guard<std::mutex> l(mu_);
    kv_.erase(k);
  }
  size_t keyCount() {
    std::lock_guard<std::mutex> l(mu_);
    return kv_.size();
  }
  int64_t add(const std::string& k, int64_t delta) override {
    std::lock_guard<std::mutex> l(mu_);
    int64_t v = (kv_.count(k) ? std::stoll(kv_[k]) : 0) + delta;
    kv_[k] = std::to_string(v);
    cv_.notify_all();
    return v;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> kv_;
};
