// The calls in flight (common/calls_in_flight.h): a call names itself while
// it runs, on any thread, nested scopes restore the outer one, and a
// finished call is gone.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "check.h"
#include "common/calls_in_flight.h"

using smdccl::CallInFlight;
using smdccl::callsInFlight;
using namespace std::chrono_literals;

TEST(call_in_flight_names_itself_on_another_thread) {
  std::atomic<bool> inside{false}, leave{false};
  std::thread t([&] {
    CallInFlight call("cudaFreeHost (test)");
    inside = true;
    while (!leave) std::this_thread::sleep_for(1ms);
  });
  while (!inside) std::this_thread::yield();
  std::this_thread::sleep_for(20ms);
  std::string now = callsInFlight();
  CHECK(now.find("cudaFreeHost (test) for ") != std::string::npos);
  CHECK(now.find(" ms") != std::string::npos);
  leave = true;
  t.join();
  CHECK(callsInFlight().find("cudaFreeHost (test)") == std::string::npos);
}

TEST(nested_calls_restore_the_outer_one) {
  {
    CallInFlight outer("outer call (test)");
    {
      CallInFlight inner("inner call (test)");
      std::string now = callsInFlight();
      CHECK(now.find("inner call (test)") != std::string::npos);
      CHECK(now.find("outer call (test)") == std::string::npos);
    }
    CHECK(callsInFlight().find("outer call (test)") != std::string::npos);
  }
  CHECK(callsInFlight().find("(test)") == std::string::npos);
}
