#pragma once
// A KVStore in a directory, for tests whose ranks are processes: one file
// per key (written whole, then renamed into place), a lock file for add().
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "common/error.h"
#include "common/store.h"

class FileStore : public smdccl::KVStore {
 public:
  explicit FileStore(std::string dir) : dir_(std::move(dir)) {}
  void set(const std::string& k, const std::string& v) override {
    std::string tmp = path(k) + ".tmp" + std::to_string(getpid());
    std::ofstream(tmp, std::ios::binary) << v;
    std::rename(tmp.c_str(), path(k).c_str());
  }
  std::string get(const std::string& k, smdccl::Deadline d) override {
    while (!check(k)) {
      if (d.expired())
        throw smdccl::CommError(smdccl::CommError::Kind::Timeout, "store timeout " + k);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::ifstream in(path(k), std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  bool check(const std::string& k) override { return access(path(k).c_str(), F_OK) == 0; }
  void remove(const std::string& k) override { std::remove(path(k).c_str()); }
  int64_t add(const std::string& k, int64_t delta) override {
    int lock = open((dir_ + "/.lock").c_str(), O_CREAT | O_RDWR, 0600);
    flock(lock, LOCK_EX);
    int64_t v = delta;
    if (check(k)) v += std::stoll(get(k, smdccl::Deadline::never()));
    set(k, std::to_string(v));
    flock(lock, LOCK_UN);
    close(lock);
    return v;
  }

 private:
  std::string path(const std::string& k) const {
    std::string name = k;
    for (char& c : name)
      if (c == '/') c = '%';
    return dir_ + "/" + name;
  }
  std::string dir_;
};
