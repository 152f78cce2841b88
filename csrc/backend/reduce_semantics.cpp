#include "backend/reduce_semantics.h"

namespace smdccl {

Wire ReduceSemantics::useWire(Comm& c, DType dt, ReduceSpec& spec) const {
  c.wire = wire_.wire;
  c.wireIntra = wire_.intra;
  // int8: float32 SUM (AVG and PREMUL_SUM reach here as SUM with their
  // scaling around it; block scales make the magnitude irrelevant).
  c.int8 = wire_.int8 && dt == DType::F32 && spec.op == RedOp::Sum;
  // No compressed hop (one node, compression_intra off): the op is the
  // uncompressed group's, bit for bit (AVG divides after the sum, no fp16
  // overflow round).
  if (!c.compressesSomeHop(dt)) {
    c.wire = Wire::F32;
    return Wire::F32;
  }
  if (spec.postDivide != 1.0) {  // AVG: divide before the wire, where 16 bits must hold it
    spec.preScale = 1.0 / spec.postDivide;
    spec.postDivide = 1.0;
  }
  return c.wire;
}

bool ReduceSemantics::int8Runs(const Comm& c) const {
  const Hierarchy* h = c.levels;
  return wire_.int8 && h && c.members.empty() && h->numNodes() > 1 && h->uniform();
}

bool ReduceSemantics::int8Widens(const Comm& c, DType dt, const ReduceSpec& spec) const {
  return (dt == DType::F16 || dt == DType::BF16) && spec.op == RedOp::Sum && int8Runs(c);
}

bool ReduceSemantics::compressesSomeHop(Comm& c) const {
  c.wire = wire_.wire;
  c.wireIntra = wire_.intra;
  if (wire_.int8) return int8Runs(c);
  return c.compressesSomeHop(DType::F32);
}

std::vector<at::Tensor> ReduceSemantics::widened(const std::vector<at::Tensor>& ts,
                                                 int64_t room) const {
  int64_t total = room;
  for (const auto& t : ts) total += t.numel();
  const at::Tensor& like = ts[0];
  at::Tensor wide = like.is_cpu() ? widened_.take(total, at::kFloat)
                                  : at::empty({total}, like.options().dtype(at::kFloat));
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (const auto& t : ts) {
    parts.push_back(wide.narrow(0, at, t.numel()));
    parts.back().copy_(t.reshape({-1}));
    at += t.numel();
  }
  if (room > 0) parts.push_back(wide.narrow(0, at, room));
  return parts;
}

}  // namespace smdccl
