#include "transport/device_wide_fence.h"

#include "common/error.h"

namespace smdccl {

DeviceWideFence& DeviceWideFence::process() {
  // Leaked on purpose: groups may be torn down during static destruction.
  static auto* fence = new DeviceWideFence;
  return *fence;
}

DeviceWideFence::Window::Window(DeviceWideFence& fence, Deadline deadline,
                                const std::string& what) {
  std::unique_lock<std::mutex> lock(fence.mu_);
  if (!fence.cv_.wait_until(lock, deadline.at(), [&] { return !fence.calling_; }))
    throw CommError(CommError::Kind::Timeout,
                    strCat("smdccl: ", what,
                           " waited past its deadline for a device-wide "
                           "CUDA call of this process (a freed buffer) to end: is the GPU "
                           "stuck behind other work?"));
  ++fence.windows_;
  fence_ = &fence;
}

DeviceWideFence::Window& DeviceWideFence::Window::operator=(Window&& o) noexcept {
  if (this != &o) {
    close();
    fence_ = o.fence_;
    o.fence_ = nullptr;
  }
  return *this;
}

void DeviceWideFence::Window::close() noexcept {
  if (!fence_) return;
  fence_->leave();
  fence_ = nullptr;
}

void DeviceWideFence::leave() noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  if (--windows_ == 0) cv_.notify_all();
}

void DeviceWideFence::exclusive(const std::function<void()>& call) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    // Each window ends with its op (which has a deadline of its own).
    cv_.wait(lock, [&] { return windows_ == 0 && !calling_; });
    calling_ = true;
  }
  struct Done {
    DeviceWideFence& f;
    ~Done() {
      std::lock_guard<std::mutex> lock(f.mu_);
      f.calling_ = false;
      f.cv_.notify_all();
    }
  } done{*this};
  call();
}

int DeviceWideFence::openWindows() {
  std::lock_guard<std::mutex> lock(mu_);
  return windows_;
}

}  // namespace smdccl
