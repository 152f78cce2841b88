#pragma once
// What a running collective knows about itself: for error messages, the
// deadline every wait honours, how to wait, and what every rank of the group
// must agree on (its signature).
#include <atomic>
#include <cstdint>
#include <string>

#include "common/deadline.h"

namespace smdccl {

struct WaitPolicy {
  int spinUs = 20;     // busy-poll this long after the last progress...
  int yieldUs = 2000;  // ...then poll with sched_yield() this long, then sleep
};

// One collective call as every rank must make it: checked across ranks by
// the header that opens the op's first message on each link
// (algorithms/op_header.h).
struct OpSignature {
  static constexpr uint64_t kAnyCount = ~uint64_t{0};
  std::string name = "?";
  int dtype = -1;              // torch's ScalarType code; -1: none
  std::string dtypeName;       // "Float", for messages
  int redop = -1;              // torch's ReduceOp::RedOpType code; -1: not a reduction
  int root = -1;               // -1: no root
  uint64_t count = kAnyCount;  // elements every rank passes; kAnyCount: ranks may differ
  uint64_t shapeHash = 0;      // shapes every rank passes (compared under DETAIL); 0: any

  // "allreduce(float32, 1000 elements, sum)"
  std::string describe() const;
};

struct OpContext {
  const char* opName = "?";
  const std::string* group = nullptr;  // owned by the backend
  int rank = 0;                        // in the group
  uint64_t seq = 0;                    // 0: not a numbered collective (no op headers)
  Deadline deadline = Deadline::never();
  WaitPolicy wait;
  OpSignature sig;
  bool compareShapes = false;  // full fingerprint (SMDCCL_DEBUG=DETAIL)
  // Set when the group is aborted (ProcessGroup.abort()): every wait of the
  // op gives up at its next check. nullptr: never.
  const std::atomic<bool>* cancel = nullptr;
  // Where set, every finished send adds the bytes it put on its link (the
  // packed 16-bit bytes on a compressed hop): the tests count what each
  // rank moves per schedule.
  uint64_t* sentBytes = nullptr;

  std::string describe() const;  // "allreduce #7 on group 'g' (rank 0)"
};

}  // namespace smdccl
