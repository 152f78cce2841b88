// The fence between gated GPU work and device-wide CUDA calls
// (transport/device_wide_fence.h), on the host: a call waits for the open
// windows, a window waits for a running call, and a window that waits past
// its deadline names what waited.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"
#include "common/error.h"
#include "transport/device_wide_fence.h"

using smdccl::CommError;
using smdccl::Deadline;
using smdccl::DeviceWideFence;
using namespace std::chrono_literals;

TEST(device_wide_call_waits_for_every_open_window) {
  DeviceWideFence fence;
  DeviceWideFence::Window a(fence, Deadline::after(5s), "op a");
  DeviceWideFence::Window b(fence, Deadline::after(5s), "op b");
  CHECK(fence.openWindows() == 2);
  std::atomic<bool> called{false};
  std::thread freer([&] { fence.exclusive([&] { called = true; }); });
  std::this_thread::sleep_for(50ms);
  CHECK(!called);
  a.close();
  std::this_thread::sleep_for(50ms);
  CHECK(!called);  // b is still open
  b.close();
  freer.join();
  CHECK(called);
  CHECK(fence.openWindows() == 0);
}

TEST(window_waits_for_a_running_device_wide_call) {
  DeviceWideFence fence;
  std::atomic<bool> inCall{false}, callDone{false};
  std::thread freer([&] {
    fence.exclusive([&] {
      inCall = true;
      std::this_thread::sleep_for(100ms);
      callDone = true;
    });
  });
  while (!inCall) std::this_thread::yield();
  DeviceWideFence::Window w(fence, Deadline::after(5s), "op");
  CHECK(callDone);  // opened only after the call ended
  freer.join();
}

TEST(window_past_its_deadline_names_what_waited) {
  DeviceWideFence fence;
  std::atomic<bool> inCall{false}, release{false};
  std::thread freer([&] {
    fence.exclusive([&] {
      inCall = true;
      while (!release) std::this_thread::sleep_for(1ms);
    });
  });
  while (!inCall) std::this_thread::yield();
  std::string msg;
  try {
    DeviceWideFence::Window w(fence, Deadline::after(30ms), "a staged op's copies");
  } catch (const CommError& e) {
    msg = e.what();
    CHECK(e.kind() == CommError::Kind::Timeout);
  }
  CHECK(msg.find("a staged op's copies") != std::string::npos);
  CHECK(msg.find("device-wide") != std::string::npos);
  CHECK(fence.openWindows() == 0);  // the failed window holds nothing
  release = true;
  freer.join();
}

TEST(moved_window_closes_once) {
  DeviceWideFence fence;
  DeviceWideFence::Window a(fence, Deadline::after(5s), "op");
  DeviceWideFence::Window b = std::move(a);
  CHECK(!a.open() && b.open());
  CHECK(fence.openWindows() == 1);
  a.close();  // moved from: nothing
  CHECK(fence.openWindows() == 1);
  b = DeviceWideFence::Window(fence, Deadline::after(5s), "next op");  // the old one closes
  CHECK(fence.openWindows() == 1);
  b.close();
  b.close();
  CHECK(fence.openWindows() == 0);
}
