#include "common/exit_fence.h"

#include <chrono>
#include <thread>

namespace smdccl {

namespace exit_fence {
std::atomic<bool> exiting{false};
std::atomic<int> dropping{0};
}  // namespace exit_fence

void markProcessExiting() {
  exit_fence::exiting.store(true);
  // A drop that saw the flag down may still need the GIL: the caller has
  // released it, so the drop finishes before finalization starts.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (exit_fence::dropping.load() > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

}  // namespace smdccl
