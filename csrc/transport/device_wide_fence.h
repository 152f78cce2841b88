#pragma once
// CUDA's device-wide calls (cudaFree, cudaFreeHost) hold the driver's lock
// while they wait for everything queued on the device, so no other thread of
// the process queues GPU work meanwhile. GPU work that waits behind a gate
// this process's host opens (the staged copies, a host-staged op's copies
// back) would then never run: the host that opens the gate is stuck behind
// that lock (an outgrown pinned buffer freed while an op's copies are
// queued, say; not shown to be what hung the gated paths on an H100 on
// 2026-11-27, which hung with this fence too). The fence keeps the
// two apart: a window is held from before an op queues its first gated work
// until all of its gates are open (any number of windows at once), and a
// device-wide call runs only while no window is open (one at a time; windows
// opened meanwhile wait for it, bounded by the device draining).
// Host-only logic: the callers pass the CUDA calls in.
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>

#include "common/deadline.h"

namespace smdccl {

class DeviceWideFence {
 public:
  // The fence of this process (every group and thread of it).
  static DeviceWideFence& process();

  class Window {
   public:
    Window() = default;
    // Waits while a device-wide call runs; past `deadline` raises a timeout
    // (CommError) naming `what`.
    Window(DeviceWideFence& fence, Deadline deadline, const std::string& what);
    ~Window() { close(); }
    Window(Window&& o) noexcept : fence_(o.fence_) { o.fence_ = nullptr; }
    Window& operator=(Window&& o) noexcept;
    Window(const Window&) = delete;
    Window& operator=(const Window&) = delete;
    bool open() const { return fence_ != nullptr; }
    void close() noexcept;

   private:
    DeviceWideFence* fence_ = nullptr;
  };

  // Runs `call` once no window is open; windows opened meanwhile wait for
  // it. Not from a thread that holds a window (it would wait for itself).
  void exclusive(const std::function<void()>& call);

  int openWindows();

 private:
  void leave() noexcept;

  std::mutex mu_;
  std::condition_variable cv_;
  int windows_ = 0;
  bool calling_ = false;
};

}  // namespace smdccl
