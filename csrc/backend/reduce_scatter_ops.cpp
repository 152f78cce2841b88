// SmdcclBackend's reduce-scatter (all forms). Checks on the caller's
// thread; on the progress thread (see enqueue()) the body scales around
// the reduction (ReduceSemantics says where) and hands the data to the
// algorithms (collectives.h) or the GPU paths (DeviceOp).
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <utility>

#include "algorithms/collectives.h"
#include "backend/backend.h"
#include "backend/call_checks.h"
#include "backend/host_buffers.h"
#include "backend/arg_checks.h"
#include "backend/padded_blocks.h"
#include "backend/reduce_scaling.h"
#include "backend/reduce_semantics.h"
#include "backend/wire_overflow_check.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

// ---------------------------------------------------------------- reduce-scatter

namespace {

// Whether a reduce-scatter may read `input` where it lies while writing
// `output` (rank's block of the result): they do not overlap, or output is
// exactly input's own block (read only by the reduction that writes it).
bool readsInPlace(const at::Tensor& input, const at::Tensor& output, int rank) {
  const char* in = static_cast<const char*>(input.data_ptr());
  const char* out = static_cast<const char*>(output.data_ptr());
  const size_t inBytes = input.nbytes(), outBytes = output.nbytes();
  return out + outBytes <= in || in + inBytes <= out ||
         out == in + static_cast<size_t>(rank) * outBytes;
}

// The same byte ranges of elements twice as wide.
Blocks twiceAsWide(Blocks b) {
  for (size_t& o : b.offset) o *= 2;
  for (size_t& l : b.length) l *= 2;
  return b;
}

// A reduce-scatter on the host: `work` (laid out as blocks) holds every
// block and is used up; block c.rank() reduced over the group lands in
// `output`. With `input` (contiguous, laid out as blocks, left as it was;
// a reduction with no pre-scale), every block is read there and `work` is
// only scratch.
struct HostReduceScatter {
  at::Tensor& work;
  const Blocks& blocks;
  at::Tensor& output;
  const at::Tensor* input = nullptr;
};
// A reduce-scatter on the op's device: `input` (c.size() blocks of
// output's length) into `output`. `input` is left as it was unless it is
// the op's own scratch (`inputIsScratch`: a pre-scale then works in place).
struct DeviceReduceScatter {
  const at::Tensor& input;
  at::Tensor& output;
  bool inputIsScratch = false;
};
// The list form on the op's device: `inputs` (one per rank, of the
// blocks' lengths) padded into one device buffer, this rank's block into
// `output`.
struct DeviceListReduceScatter {
  const std::vector<at::Tensor>& inputs;
  const Blocks& blocks;
  at::Tensor& output;
};

// A reduce-scatter's body on the progress thread, for c: the group's
// reduction rules and tuning. Each form pre-scales, reduces, post-divides
// and checks for fp16 overflow.
struct ReduceScatterBody {
  const ReduceSemantics& sem;
  Comm& c;
  const Tuning& tuning;

  void onHost(const HostReduceScatter& r, ReduceSpec spec) const {
    DType dt = toDType(r.output.scalar_type(), "reduce_scatter");
    if (sem.int8Widens(c, dt, spec)) {
      // 16-bit blocks on the int8 wire: reduced as float32 (a scratch copy),
      // this rank's block rounded to its dtype once at the end.
      std::vector<at::Tensor> wide = sem.widened({r.input ? *r.input : r.work}, r.output.numel());
      onHost({wide[0], twiceAsWide(r.blocks), wide[1]}, spec);
      r.output.copy_(wide[1].view(r.output.sizes()));
      return;
    }
    WireOverflowCheck overflow(sem.useWire(c, dt, spec));
    // Without an input apart, work holds the blocks (pre-scaled here) and is
    // read in place; either way this rank's block lands in output.
    if (!r.input) applyPreScale(r.work, spec);
    smdccl::reduceScatter(c,
                          {.buf = bytesOf(r.work),
                           .dt = dt,
                           .op = spec.op,
                           .blocks = &r.blocks,
                           .in = r.input ? bytesOf(*r.input) : bytesOf(r.work),
                           .out = bytesOf(r.output)},
                          tuning);
    applyPostDivide(r.output, spec);
    overflow.finish(c);
  }

  // reduce_scatter_tensor's form on the host: `input` (contiguous, c.size()
  // blocks of output's bytes) read where it lies, the scratch taking
  // partial sums only; a copy where the input must not be read in place (a
  // pre-scale, an output overlapping another block).
  void tensorOnHost(ScratchPool& scratch, const at::Tensor& input, at::Tensor& output,
                    ReduceSpec spec) const {
    Blocks blocks = Blocks::equal(c.size(), output.nbytes());
    if (spec.needsPreScale() || !readsInPlace(input, output, c.rank())) {
      at::Tensor work = scratch.copyOf(input);  // the input is left as it was
      return onHost({work, blocks, output}, spec);
    }
    at::Tensor work = scratch.take(input.numel(), input.scalar_type());
    onHost({work, blocks, output, &input}, spec);
  }

  void onDevice(DeviceOp& dev, const DeviceReduceScatter& r, ReduceSpec spec) const {
    DType dt = toDType(r.output.scalar_type(), "reduce_scatter");
    if (sem.int8Widens(c, dt, spec)) {  // as on the host, on the device
      std::vector<at::Tensor> wide = sem.widened({r.input}, r.output.numel());
      onDevice(dev, {wide[0], wide[1], /*inputIsScratch=*/true}, spec);
      r.output.copy_(wide[1].view(r.output.sizes()));
      return;
    }
    WireOverflowCheck overflow(sem.useWire(c, dt, spec));
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

  void onDevice(DeviceOp& dev, const DeviceListReduceScatter& r, const ReduceSpec& spec) const {
    PaddedBlocks in(r.blocks, r.output);
    for (int q = 0; q < c.size(); ++q)
      in.block(q, r.blocks.length[static_cast<size_t>(q)])
          .copy_(byteView(r.inputs[static_cast<size_t>(q)]));
    const at::ScalarType dt = r.output.scalar_type();
    if (in.each() == r.output.nbytes())
      return onDevice(dev, {in.all(dt), r.output, /*inputIsScratch=*/true}, spec);
    // Uneven blocks: this rank's padded block lands apart first.
    at::Tensor mine =
        at::empty({static_cast<int64_t>(in.each())}, r.output.options().dtype(at::kByte));
    at::Tensor result = mine.view(dt);
    onDevice(dev, {in.all(dt), result, /*inputIsScratch=*/true}, spec);
    byteView(r.output).copy_(mine.narrow(0, 0, static_cast<int64_t>(r.output.nbytes())));
  }
};

}  // namespace

WorkPtr SmdcclBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                      std::vector<std::vector<at::Tensor>>& inputs,
                                      const ::c10d::ReduceScatterOptions& opts) {
  at::Tensor out = checkSingle(outputs, "reduce_scatter");
  checkOneList(inputs, size_, "reduce_scatter", "input_list");
  Blocks blocks =  // in bytes: the same for complex tensors and their real views
      checkBlockList(inputs[0], out, {"reduce_scatter", rank_, size_}, "input_list", "output");
  out = realView(out, opts.reduceOp, "reduce_scatter", "output");
  std::vector<at::Tensor> real =
      realViews(inputs[0], opts.reduceOp, "reduce_scatter", "input_list");
  ReduceSpec spec = toReduceSpec(opts.reduceOp, out.scalar_type(), size_, "reduce_scatter");
  auto dev = deviceOps_->begin(allOf(real, {out}), "reduce_scatter");
  OpCall call = blockListCall(real, out, redOpCode(opts.reduceOp));
  call.inputs = real;
  Tuning tuning = tuning_;
  return enqueue({.type = OpType::REDUCE_SCATTER,
                  .name = "reduce_scatter",
                  .call = std::move(call),
                  .outputs = outputs,
                  .body =
                      [this, real, out, blocks, spec, tuning, dev](Comm& c) mutable {
                        // CUDA tensors: the blocks padded into one device buffer.
                        if (dev)
                          return ReduceScatterBody{reduce_, c, tuning}.onDevice(
                              *dev, DeviceListReduceScatter{real, blocks, out}, spec);
                        at::Tensor work =
                            scratch_.take(static_cast<int64_t>(numelOf(real)), out.scalar_type());
                        packInto(bytesOf(work), real);
                        ReduceScatterBody{reduce_, c, tuning}.onHost({work, blocks, out}, spec);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::_reduce_scatter_base(at::Tensor& result, at::Tensor& given,
                                            const ::c10d::ReduceScatterOptions& opts) {
  // Taken first: a call that fails its checks must not leave it to the next op.
  const int64_t feedbackKey = std::exchange(feedbackNext_, -1);
  checkTensor(given, "reduce_scatter_tensor", "input");
  checkTensor(result, "reduce_scatter_tensor", "output");
  TORCH_CHECK_VALUE(result.scalar_type() == given.scalar_type(),
                    "smdccl: reduce_scatter_tensor: output dtype ", result.scalar_type(),
                    " differs from input dtype ", given.scalar_type());
  // The engine works on real views of complex tensors; the caller's output
  // is the work's result.
  at::Tensor input = realView(given, opts.reduceOp, "reduce_scatter_tensor", "input");
  at::Tensor output = realView(result, opts.reduceOp, "reduce_scatter_tensor", "output");
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_,
                    "smdccl: reduce_scatter_tensor: input must have world_size (", size_,
                    ") x output elements = ", output.numel() * size_, ", got ", input.numel());
  ReduceSpec spec =
      toReduceSpec(opts.reduceOp, output.scalar_type(), size_, "reduce_scatter_tensor");
  auto dev = deviceOps_->begin({input, output}, "reduce_scatter_tensor");
  OpCall call = callOf({output}, output.scalar_type(), output.numel(), redOpCode(opts.reduceOp));
  call.inputs = {input};
  if (dev) {  // on the GPU (CUDA IPC inside a node), no host copies here
    Tuning tuning = tuning_;
    return enqueue({.type = OpType::_REDUCE_SCATTER_BASE,
                    .name = "reduce_scatter_tensor",
                    .call = std::move(call),
                    .outputs = {result},
                    .body =
                        [this, input, output, spec, tuning, dev, feedbackKey](Comm& c) mutable {
                          c.int8Feedback = int8FeedbackFor(feedbackKey);
                          ReduceScatterBody{reduce_, c, tuning}.onDevice(
                              *dev, DeviceReduceScatter{input, output}, spec);
                        },
                    .timeout = opts.timeout,
                    .asyncOp = opts.asyncOp,
                    .device = dev});
  }
  return enqueue({.type = OpType::_REDUCE_SCATTER_BASE,
                  .name = "reduce_scatter_tensor",
                  .call = std::move(call),
                  .outputs = {result},
                  .body =
                      [this, input, output, spec, feedbackKey](Comm& c) mutable {
                        c.int8Feedback = int8FeedbackFor(feedbackKey);
                        ReduceScatterBody{reduce_, c, tuning_}.tensorOnHost(scratch_, input, output,
                                                                            spec);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp});
}

WorkPtr SmdcclBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "smdccl: reduce_scatter_tensor_coalesced: ", inputs.size(), " inputs but ",
                    outputs.size(), " outputs; ", kReduceScatterTensorLayout);
  std::vector<ReduceSpec> specs;
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "reduce_scatter_tensor_coalesced", "input");
    checkTensor(outputs[i], "reduce_scatter_tensor_coalesced", "output");
    TORCH_CHECK_VALUE(inputs[i].numel() == outputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "smdccl: reduce_scatter_tensor_coalesced: input ", i,
                      " must have the output's dtype and world_size x its elements; ",
                      kReduceScatterTensorLayout);
  }
  std::vector<at::Tensor> realIns =
      realViews(inputs, opts.reduceOp, "reduce_scatter_tensor_coalesced", "input");
  std::vector<at::Tensor> realOuts =
      realViews(outputs, opts.reduceOp, "reduce_scatter_tensor_coalesced", "output");
  for (const auto& o : realOuts)
    specs.push_back(
        toReduceSpec(opts.reduceOp, o.scalar_type(), size_, "reduce_scatter_tensor_coalesced"));
  auto dev = deviceOps_->begin(allOf(realIns, realOuts), "reduce_scatter_tensor_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, realIns, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, realOuts, false, true);
  OpCall call = callOf(outs, outs.empty() ? at::kByte : outs[0].scalar_type(), numelOf(outs),
                       redOpCode(opts.reduceOp));
  call.inputs = ins;
  return enqueue({.type = OpType::COALESCED,
                  .name = "reduce_scatter_tensor_coalesced",
                  .call = std::move(call),
                  .outputs = outputs,
                  .body =
                      [this, ins, outs, specs](Comm& c) mutable {
                        for (size_t i = 0; i < ins.size(); ++i)
                          ReduceScatterBody{reduce_, c, tuning_}.tensorOnHost(scratch_, ins[i],
                                                                              outs[i], specs[i]);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

}  // namespace smdccl
