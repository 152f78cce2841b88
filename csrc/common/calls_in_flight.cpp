#include "common/calls_in_flight.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <vector>

#include "common/error.h"

namespace smdccl {

namespace {

int64_t nowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Slot {
  std::atomic<const char*> what{nullptr};
  std::atomic<int64_t> sinceMs{0};
};

// Every thread's slot, kept for the process's life (a few per group).
struct Registry {
  std::mutex mu;
  std::vector<std::shared_ptr<Slot>> slots;
};
Registry& registry() {
  static auto* r = new Registry;  // leaked: threads may outlive static destruction
  return *r;
}

Slot& mySlot() {
  thread_local std::shared_ptr<Slot> slot = [] {
    auto s = std::make_shared<Slot>();
    std::lock_guard<std::mutex> lock(registry().mu);
    registry().slots.push_back(s);
    return s;
  }();
  return *slot;
}

}  // namespace

CallInFlight::CallInFlight(const char* what) {
  Slot& s = mySlot();
  outer_ = s.what.load(std::memory_order_relaxed);
  outerSince_ = s.sinceMs.load(std::memory_order_relaxed);
  s.sinceMs.store(nowMs(), std::memory_order_relaxed);
  s.what.store(what, std::memory_order_release);
}

CallInFlight::~CallInFlight() {
  Slot& s = mySlot();
  s.what.store(outer_, std::memory_order_release);
  s.sinceMs.store(outerSince_, std::memory_order_relaxed);
}

std::string callsInFlight() {
  std::string out;
  const int64_t now = nowMs();
  std::lock_guard<std::mutex> lock(registry().mu);
  for (const auto& s : registry().slots) {
    const char* what = s->what.load(std::memory_order_acquire);
    if (!what) continue;
    out += strCat(out.empty() ? "" : "; ", what, " for ",
                  now - s->sinceMs.load(std::memory_order_relaxed), " ms");
  }
  return out;
}

}  // namespace smdccl
