#pragma once
// What a running collective knows about itself: for error messages, the
// deadline every wait honours, and how to wait.
#include <string>

#include "common/deadline.h"

namespace smdccl {

struct WaitPolicy {
  int spinUs = 20;     // busy-poll this long after the last progress...
  int yieldUs = 2000;  // ...then poll with sched_yield() this long, then sleep
};

struct OpContext {
  const char* op = "?";
  const std::string* group = nullptr;  // owned by the backend
  int rank = 0;
  uint64_t seq = 0;
  Deadline deadline = Deadline::never();
  WaitPolicy wait;

  std::string describe() const;  // "allreduce #7 on group 'g' (rank 0)"
};

}  // namespace smdccl
