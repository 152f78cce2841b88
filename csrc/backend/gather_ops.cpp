// SmdcclBackend's data-moving collectives: broadcast, allgather (all
// forms), gather, scatter and all-to-all. Checks on the caller's thread,
// data movement on the progress thread (see enqueue()).
#include <cstdint>
#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>

#include "algorithms/collectives.h"
#include "backend/backend.h"
#include "backend/call_checks.h"
#include "backend/host_buffers.h"
#include "backend/padded_blocks.h"
#include "backend/arg_checks.h"
#include "common/error.h"
#include "common/exit_fence.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

using ::c10d::OpType;
using WorkPtr = c10::intrusive_ptr<::c10d::Work>;

// ---------------------------------------------------------------- broadcast

WorkPtr SmdcclBackend::broadcast(std::vector<at::Tensor>& tensors,
                                 const ::c10d::BroadcastOptions& opts) {
  at::Tensor t = checkSingle(tensors, "broadcast");
  checkRank(opts.rootRank, size_, "broadcast", "root rank");
  TORCH_CHECK_VALUE(opts.rootTensor == 0, "smdccl: broadcast: rootTensor must be 0");
  int root = static_cast<int>(opts.rootRank);
  Tuning tuning = tuning_;
  // Only the root's data is sent: only its input is checked for NaN/Inf.
  OpCall call = callOf({t}, t.scalar_type(), t.numel(), -1, root);
  if (root != rank_) call.inputs.clear();
  auto dev = deviceOps_->begin({t}, "broadcast");
  return enqueue(
      {.type = OpType::BROADCAST,
       .name = "broadcast",
       .call = std::move(call),
       .outputs = tensors,
       // CUDA tensors: the device path (NCCL inside one node, else staged).
       .body =
           [t, dev, root, tuning](Comm& c) {
             if (dev) dev->broadcast(c, {.buf = bytesOf(t), .bytes = t.nbytes(), .root = root}, tuning);
             else smdccl::broadcast(c, bytesOf(t), t.nbytes(), root, tuning);
           },
       .timeout = opts.timeout,
       .asyncOp = opts.asyncOp,
       .device = dev});
}

// ---------------------------------------------------------------- allgather

namespace {

// The list form on CUDA tensors: the blocks (`blocks`, as checked at the
// call) padded into one device buffer, the device path's allgather, each
// block out (no pinned copy).
struct ListGather {
  const at::Tensor& in;
  std::vector<at::Tensor>& outs;
  const Blocks& blocks;
};
void allgatherPadded(Comm& c, DeviceOp& dev, const ListGather& g, const Tuning& tuning) {
  const at::Tensor& in = g.in;
  PaddedBlocks all(g.blocks, in);
  const int me = c.rank();
  all.block(me, in.nbytes()).copy_(byteView(in));
  dev.allgather(c,
                {.in = all.data() + static_cast<size_t>(me) * all.each(),
                 .out = all.data(),
                 .eachBytes = all.each()},
                tuning);
  for (int r = 0; r < c.size(); ++r)
    byteView(g.outs[static_cast<size_t>(r)])
        .copy_(all.block(r, g.blocks.length[static_cast<size_t>(r)]));
}

}  // namespace

WorkPtr SmdcclBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                 std::vector<at::Tensor>& inputs,
                                 const ::c10d::AllgatherOptions& opts) {
  at::Tensor in = checkSingle(inputs, "allgather");
  checkOneList(outputs, size_, "allgather", "output_tensor_list");
  Blocks blocks =
      checkBlockList(outputs[0], in, {"allgather", rank_, size_}, "output_tensor_list", "input");
  auto dev = deviceOps_->begin(allOf(outputs[0], {in}), "allgather");
  Tuning tuning = tuning_;
  return enqueue(
      {.type = OpType::ALLGATHER,
       .name = "allgather",
       .call = blockListCall(outputs[0], in),
       .outputs = outputs[0],
       .body =
           [in, outs = outputs[0], blocks, tuning, dev](Comm& c) mutable {
             if (dev) return allgatherPadded(c, *dev, {in, outs, blocks}, tuning);
             at::Tensor flat = at::empty({static_cast<int64_t>(blocks.total())}, at::kByte);
             if (in.nbytes())
               std::memcpy(bytesOf(flat) + blocks.offset[c.rank()], bytesOf(in), in.nbytes());
             smdccl::allgather(c, bytesOf(flat), blocks, tuning);
             unpackFrom(bytesOf(flat), outs);
           },
       .timeout = opts.timeout,
       .asyncOp = opts.asyncOp,
       .device = dev});
}

WorkPtr SmdcclBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                       const ::c10d::AllgatherOptions& opts) {
  checkTensor(input, "all_gather_into_tensor", "input");
  checkTensor(output, "all_gather_into_tensor", "output");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                    "smdccl: all_gather_into_tensor: output dtype ", output.scalar_type(),
                    " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_,
                    "smdccl: all_gather_into_tensor: output must have world_size (", size_,
                    ") x input elements = ", input.numel() * size_, ", got ", output.numel());
  auto dev = deviceOps_->begin({input, output}, "all_gather_into_tensor");
  Tuning tuning = tuning_;
  if (dev)  // on the GPU (CUDA IPC inside a node), no host copies here
    return enqueue(
        {.type = OpType::_ALLGATHER_BASE,
         .name = "all_gather_into_tensor",
         .call = callOf({input}, input.scalar_type(), input.numel()),
         .outputs = {output},
         .body =
             [input, output, tuning, dev](Comm& c) {
               dev->allgather(
                   c, {.in = bytesOf(input), .out = bytesOf(output), .eachBytes = input.nbytes()},
                   tuning);
             },
         .timeout = opts.timeout,
         .asyncOp = opts.asyncOp,
         .device = dev});
  return enqueue({.type = OpType::_ALLGATHER_BASE,
                  .name = "all_gather_into_tensor",
                  .call = callOf({input}, input.scalar_type(), input.numel()),
                  .outputs = {output},
                  .body =
                      [input, output, tuning](Comm& c) {
                        size_t each = input.nbytes();
                        char* mine = bytesOf(output) + each * c.rank();
                        if (each && mine != bytesOf(input))
                          std::memmove(mine, bytesOf(input), each);
                        smdccl::allgather(c, bytesOf(output), Blocks::equal(c.size(), each),
                                          tuning);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp});
}

WorkPtr SmdcclBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputLists,
                                           std::vector<at::Tensor>& inputs,
                                           const ::c10d::AllgatherOptions& opts) {
  checkPerRankLists(outputLists, inputs, size_, "allgather_coalesced");
  std::vector<at::Tensor> allOutputs;
  for (size_t r = 0; r < outputLists.size(); ++r) {
    for (size_t i = 0; i < inputs.size(); ++i)
      checkSameShapeAndType(outputLists[r][i], inputs[i], "allgather_coalesced",
                            strCat("output_tensor_lists[", r, "][", i, "]"));
    allOutputs.insert(allOutputs.end(), outputLists[r].begin(), outputLists[r].end());
  }
  for (const auto& in : inputs) checkTensor(in, "allgather_coalesced", "input");
  auto dev = deviceOps_->begin(allOf(allOutputs, inputs), "allgather_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<std::vector<at::Tensor>> outs;
  for (auto& list : outputLists) outs.push_back(hostOf(dev, list, false, true));
  Tuning tuning = tuning_;
  return enqueue({.type = OpType::ALLGATHER_COALESCED,
                  .name = "allgather_coalesced",
                  .call = callOf(ins, ins.empty() ? at::kByte : ins[0].scalar_type(), numelOf(ins)),
                  .outputs = allOutputs,
                  .outputsPerList = size_ > 1 ? inputs.size() : 0,  // gloo: flat on one rank
                  .body =
                      [ins, outs, tuning](Comm& c) {
                        allgatherPacked(c, ins, tuning,
                                        [&](size_t i, int r) { return bytesOf(outs[r][i]); });
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                       std::vector<at::Tensor>& inputs,
                                                       const ::c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(),
                    "smdccl: allgather_into_tensor_coalesced: ", inputs.size(), " inputs but ",
                    outputs.size(), " outputs; ", kGatherIntoTensorLayout);
  for (size_t i = 0; i < inputs.size(); ++i) {
    checkTensor(inputs[i], "allgather_into_tensor_coalesced", "input");
    checkTensor(outputs[i], "allgather_into_tensor_coalesced", "output");
    TORCH_CHECK_VALUE(outputs[i].numel() == inputs[i].numel() * size_ &&
                          outputs[i].scalar_type() == inputs[i].scalar_type(),
                      "smdccl: allgather_into_tensor_coalesced: output ", i,
                      " must have the input's dtype and world_size x its elements; ",
                      kGatherIntoTensorLayout);
  }
  auto dev = deviceOps_->begin(allOf(inputs, outputs), "allgather_into_tensor_coalesced");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, outputs, false, true);
  Tuning tuning = tuning_;
  return enqueue({.type = OpType::COALESCED,
                  .name = "allgather_into_tensor_coalesced",
                  .call = callOf(ins, ins.empty() ? at::kByte : ins[0].scalar_type(), numelOf(ins)),
                  .outputs = outputs,
                  .body =
                      [ins, outs, tuning](Comm& c) {
                        allgatherPacked(c, ins, tuning, [&](size_t i, int r) {
                          return bytesOf(outs[i]) + ins[i].nbytes() * r;
                        });
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

// ---------------------------------------------------------------- gather / scatter

WorkPtr SmdcclBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                              std::vector<at::Tensor>& inputs, const ::c10d::GatherOptions& opts) {
  at::Tensor in = checkSingle(inputs, "gather");
  checkRank(opts.rootRank, size_, "gather", "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devOuts =
      rootList(outputs, in, {"gather", rank_, size_}, root, "gather_list");
  auto dev = deviceOps_->begin(allOf(devOuts, {in}), "gather");
  std::vector<at::Tensor> outs = hostOf(dev, devOuts, false, true);
  at::Tensor hin = hostOf(dev, in, true, false);
  return enqueue({.type = OpType::GATHER,
                  .name = "gather",
                  .call = callOf({hin}, in.scalar_type(), in.numel(), -1, root),
                  .outputs = devOuts,
                  .body =
                      [in = hin, outs, root](Comm& c) mutable {
                        if (c.rank() != root) return gatherInto(c, in, nullptr, root);
                        at::Tensor flat =
                            at::empty({static_cast<int64_t>(in.nbytes() * c.size())}, at::kByte);
                        gatherInto(c, in, bytesOf(flat), root);
                        unpackFrom(bytesOf(flat), outs);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::gather_into_tensor(at::Tensor& output, at::Tensor& input,
                                          const ::c10d::GatherOptions& opts) {
  const char* opName = "gather_into_tensor";
  checkTensor(input, opName, "input");
  checkRank(opts.rootRank, size_, opName, "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devOuts;
  if (rank_ == root) {
    // torch passes an empty placeholder elsewhere; the root's is checked.
    checkTensor(output, opName, "output");
    TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "smdccl: ", opName,
                      ": the output has dtype ", output.scalar_type(), " but the input has ",
                      input.scalar_type());
    TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "smdccl: ", opName,
                      ": the output has ", output.numel(), " elements; it needs world_size (",
                      size_, ") x the input's ", input.numel());
    TORCH_CHECK_VALUE(
        !overlaps(output, input) || bytesOf(input) == bytesOf(output) + input.nbytes() * root,
        "smdccl: ", opName, ": the input overlaps the output other than as the root's own block");
    devOuts.push_back(output);
  }
  auto dev = deviceOps_->begin(allOf(devOuts, {input}), opName);
  std::vector<at::Tensor> outs = hostOf(dev, devOuts, false, true);
  at::Tensor hin = hostOf(dev, input, true, false);
  return enqueue({.type = OpType::GATHER,
                  .name = opName,
                  .call = callOf({hin}, input.scalar_type(), input.numel(), -1, root),
                  .outputs = devOuts,
                  .body =
                      [in = hin, outs, root](Comm& c) mutable {
                        gatherInto(c, in, c.rank() == root ? bytesOf(outs[0]) : nullptr, root);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::scatter(std::vector<at::Tensor>& outputs,
                               std::vector<std::vector<at::Tensor>>& inputs,
                               const ::c10d::ScatterOptions& opts) {
  at::Tensor out = checkSingle(outputs, "scatter");
  checkRank(opts.rootRank, size_, "scatter", "root rank");
  int root = static_cast<int>(opts.rootRank);
  std::vector<at::Tensor> devIns =
      rootList(inputs, out, {"scatter", rank_, size_}, root, "scatter_list");
  auto dev = deviceOps_->begin(allOf(devIns, {out}), "scatter");
  std::vector<at::Tensor> ins = hostOf(dev, devIns, true, false);
  at::Tensor hout = hostOf(dev, out, false, true);
  // The signature counts the output: only the root passes a scatter_list.
  OpCall call = callOf({hout}, out.scalar_type(), out.numel(), -1, root);
  call.inputs = ins;
  return enqueue({.type = OpType::SCATTER,
                  .name = "scatter",
                  .call = std::move(call),
                  .outputs = outputs,
                  .body =
                      [ins, out = hout, root](Comm& c) {
                        size_t each = out.nbytes();
                        if (c.rank() != root) {
                          directScatter(c, {.out = bytesOf(out), .bytes = each, .root = root});
                          return;
                        }
                        at::Tensor flat =
                            at::empty({static_cast<int64_t>(each * c.size())}, at::kByte);
                        packInto(bytesOf(flat), ins);
                        Blocks blocks = Blocks::equal(c.size(), each);
                        directScatter(c, {.in = bytesOf(flat),
                                          .out = bytesOf(out),
                                          .bytes = each,
                                          .blocks = &blocks,
                                          .root = root});
                        if (each) std::memcpy(bytesOf(out), bytesOf(flat) + each * root, each);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

// ---------------------------------------------------------------- all-to-all

static std::vector<size_t> splitBytes(const std::vector<int64_t>& splits, const at::Tensor& t,
                                      int size, const char* which) {
  int64_t rows = t.dim() > 0 ? t.size(0) : 1;
  size_t rowBytes = rows ? t.nbytes() / rows : 0;
  std::vector<size_t> out;
  if (splits.empty()) {
    TORCH_CHECK_VALUE(rows % size == 0, "smdccl: all_to_all_single: ", which, " dim 0 (", rows,
                      ") must divide by the world size (", size, ") when no split sizes are given");
    out.assign(size, rowBytes * (rows / size));
    return out;
  }
  TORCH_CHECK_VALUE(static_cast<int>(splits.size()) == size, "smdccl: all_to_all_single: ", which,
                    " split sizes need one entry per rank (", size, "), got ", splits.size());
  int64_t sum = 0;
  for (int64_t s : splits) {
    TORCH_CHECK_VALUE(s >= 0, "smdccl: all_to_all_single: negative split size ", s);
    sum += s;
    out.push_back(rowBytes * static_cast<size_t>(s));
  }
  TORCH_CHECK_VALUE(sum == rows, "smdccl: all_to_all_single: ", which, " split sizes sum to ", sum,
                    " but dim 0 is ", rows);
  return out;
}

WorkPtr SmdcclBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                     std::vector<int64_t>& outputSplits,
                                     std::vector<int64_t>& inputSplits,
                                     const ::c10d::AllToAllOptions& opts) {
  checkTensor(input, "all_to_all_single", "input");
  checkTensor(output, "all_to_all_single", "output");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(),
                    "smdccl: all_to_all_single: output dtype ", output.scalar_type(),
                    " differs from input dtype ", input.scalar_type());
  Blocks sendB = Blocks::fromLengths(splitBytes(inputSplits, input, size_, "input"));
  Blocks recvB = Blocks::fromLengths(splitBytes(outputSplits, output, size_, "output"));
  TORCH_CHECK_VALUE(sendB.length[rank_] == recvB.length[rank_],
                    "smdccl: all_to_all_single: this rank (", rank_, ") sends itself ",
                    sendB.length[rank_], " bytes (input_split_sizes[", rank_, "]) but expects ",
                    recvB.length[rank_], " bytes from itself (output_split_sizes[", rank_,
                    "]); the two must match");
  auto dev = deviceOps_->begin({input, output}, "all_to_all_single");
  at::Tensor in = hostOf(dev, input, true, false), out = hostOf(dev, output, false, true);
  // Split sizes may differ between ranks: only the dtype is compared.
  return enqueue({.type = OpType::ALLTOALL_BASE,
                  .name = "all_to_all_single",
                  .call = callOf({in}, in.scalar_type(), OpSignature::kAnyCount),
                  .outputs = {output},
                  .body =
                      [in, out, sendB, recvB](Comm& c) {
                        // Sending from memory that is being received into would corrupt it.
                        at::Tensor src = overlaps(in, out) ? in.clone() : in;
                        directAlltoall(c, bytesOf(src), sendB, bytesOf(out), recvB);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

WorkPtr SmdcclBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                const ::c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(
      static_cast<int>(inputs.size()) == size_ && static_cast<int>(outputs.size()) == size_,
      "smdccl: all_to_all needs one input and one output tensor per rank (", size_, "), got ",
      inputs.size(), " and ", outputs.size());
  std::vector<size_t> sendLen, recvLen;
  for (int r = 0; r < size_; ++r) {
    checkTensor(inputs[r], "all_to_all", "input");
    checkTensor(outputs[r], "all_to_all", "output");
    TORCH_CHECK_VALUE(inputs[r].scalar_type() == inputs[0].scalar_type() &&
                          outputs[r].scalar_type() == inputs[0].scalar_type(),
                      "smdccl: all_to_all: all tensors must share one dtype");
    sendLen.push_back(inputs[r].nbytes());
    recvLen.push_back(outputs[r].nbytes());
  }
  TORCH_CHECK_VALUE(sendLen[rank_] == recvLen[rank_], "smdccl: all_to_all: input_tensor_list[",
                    rank_, "] (what this rank sends itself) has ", inputs[rank_].numel(),
                    " elements but output_tensor_list[", rank_, "] has ", outputs[rank_].numel(),
                    "; the two must match");
  auto dev = deviceOps_->begin(allOf(inputs, outputs), "all_to_all");
  std::vector<at::Tensor> ins = hostOf(dev, inputs, true, false);
  std::vector<at::Tensor> outs = hostOf(dev, outputs, false, true);
  Blocks sendB = Blocks::fromLengths(sendLen), recvB = Blocks::fromLengths(recvLen);
  return enqueue({.type = OpType::ALLTOALL,
                  .name = "all_to_all",
                  .call = callOf(ins, ins[0].scalar_type(), OpSignature::kAnyCount),
                  .outputs = outputs,
                  .body =
                      [ins, outs, sendB, recvB](Comm& c) mutable {
                        at::Tensor in = at::empty({static_cast<int64_t>(sendB.total())}, at::kByte);
                        at::Tensor out =
                            at::empty({static_cast<int64_t>(recvB.total())}, at::kByte);
                        packInto(bytesOf(in), ins);
                        directAlltoall(c, bytesOf(in), sendB, bytesOf(out), recvB);
                        unpackFrom(bytesOf(out), outs);
                      },
                  .timeout = opts.timeout,
                  .asyncOp = opts.asyncOp,
                  .device = dev});
}

}  // namespace smdccl
