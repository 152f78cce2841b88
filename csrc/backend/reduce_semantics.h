#pragma once
// What a group's compression means for a reduction, beyond moving data:
// which wire a float32 reduction crosses (SMDCCL_COMPRESSION, decided from
// the topology), where AVG divides (before a 16-bit wire, whose range must
// hold the values; after the sum otherwise), and when 16-bit tensors are
// reduced as float32 (the int8 wire). The reducing ops' bodies
// (allreduce_ops.cpp, reduce_scatter_ops.cpp) ask it on the progress thread.
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "algorithms/comm.h"
#include "backend/reduce_scaling.h"
#include "backend/scratch_pool.h"

namespace smdccl {

// The group's compression: its 16-bit wire between nodes (F32: none), and
// whether it compresses inside nodes too.
struct WireChoice {
  Wire wire = Wire::F32;
  bool intra = false;
  bool int8 = false;  // block int8 between nodes (BackendConfig::int8)
};

class ReduceSemantics {
 public:
  explicit ReduceSemantics(WireChoice wire) : wire_(wire) {}

  // Sets c's wire for a dt reduction with some compressed hop
  // (Comm::compressesSomeHop) and makes AVG pre-scale (16-bit range);
  // returns the wire (F32: no hop compressed, the op runs uncompressed).
  Wire useWire(Comm& c, DType dt, ReduceSpec& spec) const;
  // Whether the int8 wire runs on c (an int8 group over several nodes of
  // one size, the whole group): the rule TwoLevelInt8::canRun also keeps.
  bool int8Runs(const Comm& c) const;
  // Whether a reduction of dt crosses the int8 wire as float32 (a bf16 /
  // fp16 SUM on an int8 group spanning nodes): widened to a float32 copy
  // (widened()), reduced, rounded to dt once at the end.
  bool int8Widens(const Comm& c, DType dt, const ReduceSpec& spec) const;
  // Whether a float32 reduction over the whole of c would cross a 16-bit
  // hop (int8: whether its SUM allreduce would run the int8 wire).
  bool compressesSomeHop(Comm& c) const;
  // `ts` copied one after another, as float32, into one buffer on ts[0]'s
  // device (host: a scratch buffer of its own, as the group's may hold the
  // 16-bit work), with `room` elements after them: the copies, then the room
  // where room > 0.
  std::vector<at::Tensor> widened(const std::vector<at::Tensor>& ts, int64_t room = 0) const;

 private:
  WireChoice wire_;
  mutable ScratchPool widened_;
};

}  // namespace smdccl
