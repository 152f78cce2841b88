#include "algorithms/stream_gate.h"

#include <atomic>

namespace smdccl {

uint32_t StreamGate::hold(FlagQueue& q) {
  const uint32_t ticket = ++held_;
  q.waitFor(flag_, ticket);
  return ticket;
}

void StreamGate::release(uint32_t ticket) {
  auto* f = reinterpret_cast<std::atomic<uint32_t>*>(flag_);
  // Never backwards: a late release of an older ticket leaves a newer one open.
  uint32_t cur = f->load(std::memory_order_relaxed);
  while (!flagReached(cur, ticket) &&
         !f->compare_exchange_weak(cur, ticket, std::memory_order_release,
                                   std::memory_order_relaxed)) {}
}

bool StreamGate::released(uint32_t ticket) const {
  return flagReached(
      reinterpret_cast<const std::atomic<uint32_t>*>(flag_)->load(std::memory_order_acquire),
      ticket);
}

}  // namespace smdccl
