#pragma once
// fp16 on the wire tops out at 65504: a float32 sum whose partial sums pass
// it would arrive as inf. Never hand that back silently: the fp16 pack counts
// finite values it turned into inf on this thread, and the ranks agree (one
// tiny round) on whether any of them did; if so, every rank raises. An inf
// that was in an input is not an overflow and passes through.
#include "algorithms/collectives.h"
#include "algorithms/comm.h"
#include "common/trace.h"
#include "kernels/cpu/reduce.h"

#include <c10/util/Exception.h>

#include <cstdint>

namespace smdccl {

class WireOverflowCheck {
 public:
  explicit WireOverflowCheck(Wire wire) : on_(wire == Wire::F16), before_(tlsFp16Overflows) {}
  void finish(Comm& c) {
    if (!on_) return;
    trace::Span span("fp16 overflow check", "check", *c.ctx.group);
    uint8_t overflowed = tlsFp16Overflows != before_ ? 1 : 0;
    recursiveDoublingAllreduce(c, reinterpret_cast<char*>(&overflowed), 1, DType::U8, RedOp::Max);
    TORCH_CHECK_VALUE(!overflowed, "smdccl: ", c.ctx.describe(),
                      ": a float32 sum overflowed the fp16 wire (|partial sum| > 65504) and "
                      "became inf; use SMDCCL_COMPRESSION=bf16 (float32's range), ReduceOp.AVG "
                      "(scaled before the wire), scale the tensor down, or turn compression off");
  }

 private:
  bool on_;
  uint64_t before_;
};

}  // namespace smdccl
