#include "backend/reduce_semantics.h"

#include "algorithms/collectives.h"
#include "backend/arg_checks.h"
#include "backend/call_checks.h"
#include "backend/host_buffers.h"
#include "backend/padded_blocks.h"
#include "backend/wire_overflow_check.h"

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

at::Tensor ReduceSemantics::wideBuffer(int64_t numel, const at::Tensor& like) const {
  if (like.is_cpu()) return widened_.take(numel, at::kFloat);
  return at::empty({numel}, like.options().dtype(at::kFloat));  // on the op's stream
}

namespace {

// `ts` copied into `flat` one after another (converted to its dtype): the
// parts of flat they fill.
std::vector<at::Tensor> copyInto(const at::Tensor& flat, const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  int64_t at = 0;
  for (const auto& t : ts) {
    parts.push_back(flat.narrow(0, at, t.numel()));
    parts.back().copy_(t.reshape({-1}));
    at += t.numel();
  }
  return parts;
}

// The same byte ranges of elements twice as wide.
Blocks twiceAsWide(Blocks b) {
  for (size_t& o : b.offset) o *= 2;
  for (size_t& l : b.length) l *= 2;
  return b;
}

}  // namespace

std::pair<at::Tensor, at::Tensor> ReduceSemantics::widenedInOut(const at::Tensor& in,
                                                                int64_t outNumel) const {
  at::Tensor wide = wideBuffer(in.numel() + outNumel, in);
  return {copyInto(wide, {in})[0], wide.narrow(0, in.numel(), outNumel)};
}

void ReduceSemantics::allreduceOne(Comm& c, at::Tensor& t, ReduceSpec spec,
                                   const std::shared_ptr<DeviceOp>& dev,
                                   const Tuning& tuning) const {
  DType dt = toDType(t.scalar_type(), "allreduce");
  if (int8Widens(c, dt, spec)) {
    // A 16-bit tensor on the int8 wire: summed as float32 (in a scratch
    // copy), rounded to its dtype once at the end.
    at::Tensor wide = wideBuffer(t.numel(), t);
    wide.copy_(t.reshape({-1}));
    allreduceOne(c, wide, spec, dev, tuning);
    t.copy_(wide.view(t.sizes()));
    return;
  }
  WireOverflowCheck overflow(useWire(c, dt, spec));
  applyPreScale(t, spec);
  const CollectiveArgs args{
      .buf = bytesOf(t), .count = static_cast<size_t>(t.numel()), .dt = dt, .op = spec.op};
  if (dev) dev->allreduce(c, args, tuning);  // the GPU paths
  else smdccl::allreduce(c, args, tuning);
  applyPostDivide(t, spec);
  overflow.finish(c);
}

void ReduceSemantics::allreduceFlat(Comm& c, std::vector<at::Tensor>& ts,
                                    std::vector<ReduceSpec>& specs,
                                    const std::shared_ptr<DeviceOp>& dev) const {
  DType dt = toDType(ts[0].scalar_type(), "allreduce");
  if (int8Widens(c, dt, specs[0])) {  // as allreduceOne
    std::vector<at::Tensor> parts =
        copyInto(wideBuffer(static_cast<int64_t>(numelOf(ts)), ts[0]), ts);
    allreduceFlat(c, parts, specs, dev);
    for (size_t i = 0; i < ts.size(); ++i) ts[i].view({-1}).copy_(parts[i]);
    return;
  }
  Wire wire = Wire::F32;
  int64_t total = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    wire = useWire(c, dt, specs[i]);
    applyPreScale(ts[i], specs[i]);
    total += ts[i].numel();
  }
  WireOverflowCheck overflow(wire);
  if (!dev) {
    at::Tensor flat = scratch_.take(total, ts[0].scalar_type());
    packInto(bytesOf(flat), ts);
    smdccl::allreduce(
        c, {.buf = bytesOf(flat), .count = static_cast<size_t>(total), .dt = dt, .op = specs[0].op},
        tuning_);
    unpackFrom(bytesOf(flat), ts);
  } else {
    // On the device, on the op's stream (the body's current stream): one
    // flat buffer through the IPC / staged GPU allreduce, no host copy.
    at::Tensor flat = at::empty({total}, ts[0].options());
    std::vector<at::Tensor> parts = copyInto(flat, ts);
    dev->allreduce(
        c, {.buf = bytesOf(flat), .count = static_cast<size_t>(total), .dt = dt, .op = specs[0].op},
        tuning_);
    for (size_t i = 0; i < ts.size(); ++i) ts[i].view({-1}).copy_(parts[i]);
  }
  for (size_t i = 0; i < ts.size(); ++i) applyPostDivide(ts[i], specs[i]);
  overflow.finish(c);
}

void ReduceSemantics::reduceScatter(Comm& c, const HostReduceScatter& r,
                                    const ReduceSpec& given) const {
  at::Tensor& work = r.work;
  const Blocks& blocks = r.blocks;
  at::Tensor& output = r.output;
  ReduceSpec spec = given;
  DType dt = toDType(output.scalar_type(), "reduce_scatter");
  if (int8Widens(c, dt, spec)) {
    // 16-bit blocks on the int8 wire: reduced as float32 (a scratch copy),
    // this rank's block rounded to its dtype once at the end.
    auto [in, out] = widenedInOut(r.input ? *r.input : work, output.numel());
    reduceScatter(c, {in, twiceAsWide(blocks), out}, spec);
    output.copy_(out.view(output.sizes()));
    return;
  }
  WireOverflowCheck overflow(useWire(c, dt, spec));
  // Without an input apart, work holds the blocks (pre-scaled here) and is
  // read in place; either way this rank's block lands in output.
  if (!r.input) applyPreScale(work, spec);
  smdccl::reduceScatter(c,
                        {.buf = bytesOf(work),
                         .dt = dt,
                         .op = spec.op,
                         .blocks = &blocks,
                         .in = r.input ? bytesOf(*r.input) : bytesOf(work),
                         .out = bytesOf(output)},
                        tuning_);
  applyPostDivide(output, spec);
  overflow.finish(c);
}

void ReduceSemantics::reduceScatter(Comm& c, DeviceOp& dev, const DeviceReduceScatter& r,
                                    ReduceSpec spec, const Tuning& tuning) const {
  DType dt = toDType(r.output.scalar_type(), "reduce_scatter");
  if (int8Widens(c, dt, spec)) {  // as on the host, on the device
    auto [in, out] = widenedInOut(r.input, r.output.numel());
    reduceScatter(c, dev, {in, out, /*inputIsScratch=*/true}, spec, tuning);
    r.output.copy_(out.view(r.output.sizes()));
    return;
  }
  WireOverflowCheck overflow(useWire(c, dt, spec));
  at::Tensor in = r.input;
  if (spec.needsPreScale()) {
    if (!r.inputIsScratch) in = r.input.clone();
    applyPreScale(in, spec);
  }
  dev.reduceScatter(c,
                    {.in = bytesOf(in),
                     .out = bytesOf(r.output),
                     .each = static_cast<size_t>(r.output.numel()),
                     .dt = dt,
                     .op = spec.op},
                    tuning);
  applyPostDivide(r.output, spec);
  overflow.finish(c);
}

void ReduceSemantics::reduceScatter(Comm& c, DeviceOp& dev, const DeviceListReduceScatter& r,
                                    const ReduceSpec& spec, const Tuning& tuning) const {
  PaddedBlocks in(r.blocks, r.output);
  for (int q = 0; q < c.size(); ++q)
    in.block(q, r.blocks.length[static_cast<size_t>(q)])
        .copy_(byteView(r.inputs[static_cast<size_t>(q)]));
  const at::ScalarType dt = r.output.scalar_type();
  if (in.each() == r.output.nbytes())
    return reduceScatter(c, dev, {in.all(dt), r.output, /*inputIsScratch=*/true}, spec, tuning);
  // Uneven blocks: this rank's padded block lands apart first.
  at::Tensor mine =
      at::empty({static_cast<int64_t>(in.each())}, r.output.options().dtype(at::kByte));
  at::Tensor result = mine.view(dt);
  reduceScatter(c, dev, {in.all(dt), result, /*inputIsScratch=*/true}, spec, tuning);
  byteView(r.output).copy_(mine.narrow(0, 0, static_cast<int64_t>(r.output.nbytes())));
}

bool ReduceSemantics::compressesSomeHop(Comm& c) const {
  c.wire = wire_.wire;
  c.wireIntra = wire_.intra;
  if (wire_.int8) return int8Runs(c);
  return c.compressesSomeHop(DType::F32);
}

}  // namespace smdccl
