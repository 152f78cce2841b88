#pragma once
// Cross-process sleep/wake on a 32-bit word in shared memory.
#include <atomic>
#include <cstdint>

namespace smdccl {

// Sleeps while *word == expected, at most timeoutUs; returns early on wake.
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeoutUs);
void futexWakeAll(std::atomic<uint32_t>* word);

// A doorbell in shared memory: peers ring it after changing anything the
// owner may be waiting for; the owner sleeps on it only after re-checking.
struct Doorbell {
  std::atomic<uint32_t> count;
  std::atomic<uint32_t> sleeping;

  void ring() {
    count.fetch_add(1, std::memory_order_seq_cst);
    if (sleeping.load(std::memory_order_seq_cst)) futexWakeAll(&count);
  }
};

}  // namespace smdccl
