#pragma once
// The calls into a library that may not return (CUDA's, here) that this
// process's threads are inside right now, for the message of an op that
// never got through: a call that hangs (a kernel's lazy load, a device-wide
// wait, a full launch queue, each behind a stream that waits for this host)
// then names itself and how long it has run. Two relaxed stores per call:
// cheap enough to leave on.
#include <cstdint>
#include <string>

namespace smdccl {

class CallInFlight {
 public:
  // `what`: a string literal (kept by pointer).
  explicit CallInFlight(const char* what);
  ~CallInFlight();
  CallInFlight(const CallInFlight&) = delete;
  CallInFlight& operator=(const CallInFlight&) = delete;

 private:
  const char* outer_;
  int64_t outerSince_;
};

// "packToWire (pack a copy out) for 31012 ms; ..." over every thread of the
// process inside a scope, or "" when none is.
std::string callsInFlight();

}  // namespace smdccl
