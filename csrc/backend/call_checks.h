#pragma once
// Argument checks and call signatures shared by the collectives' c10d entry
// points (allreduce_ops.cpp, gather_ops.cpp, reduce_scatter_ops.cpp): they
// run on the caller's thread and raise ValueError naming what to fix.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <cstdint>
#include <vector>

#include "algorithms/collectives.h"
#include "backend/backend.h"

namespace smdccl {

// The call being checked: the op's name in errors, this rank, the group's size.
struct CheckedCall {
  const char* opName;
  int rank;
  int size;
};

void checkOnePerRank(const std::vector<at::Tensor>& list, int size, const char* opName,
                     const char* what);
void checkOutputList(const std::vector<at::Tensor>& list, const at::Tensor& ref, int size,
                     const char* opName, const char* what);
// all_gather's output list / reduce_scatter's input list, which may be
// uneven (as with NCCL): one tensor per rank, of `ref`'s dtype; this rank's
// own block has `ref`'s element count. Returns their byte blocks.
Blocks checkBlockList(const std::vector<at::Tensor>& list, const at::Tensor& ref,
                      const CheckedCall& call, const char* what, const char* refName);
// torch's [tensor_list] layout of the per-rank lists (one list per device).
void checkOneList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* opName,
                  const char* name);
// The coalesced forms of all_gather_into_tensor / reduce_scatter_tensor
// pair tensors by index, each pair laid out as the single call's.
inline constexpr const char* kGatherIntoTensorLayout =
    "torch's layout: outputs[i] is one tensor of world_size x inputs[i]'s elements, rank r's "
    "inputs[i] at block r (as all_gather_into_tensor), not one tensor per rank";
inline constexpr const char* kReduceScatterTensorLayout =
    "torch's layout: inputs[i] is one tensor of world_size x outputs[i]'s elements, block r "
    "reduced into rank r's outputs[i] (as reduce_scatter_tensor), not one tensor per rank";
// gather's gather_list / scatter's scatter_list: one tensor per rank on the
// root, nothing elsewhere.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& ref, const CheckedCall& call, int root,
                                 const char* name);
// all_gather_coalesced's output_tensor_lists in torch's layout.
void checkPerRankLists(const std::vector<std::vector<at::Tensor>>& lists,
                       const std::vector<at::Tensor>& inputs, int size, const char* opName);
// The signature of a call (what every rank must pass alike) and the inputs
// whose contents it sends. `count`: elements each rank passes, or kAnyCount.
OpCall callOf(std::vector<at::Tensor> inputs, at::ScalarType dt, uint64_t count, int redop = -1,
              int root = -1);
uint64_t numelOf(const std::vector<at::Tensor>& ts);
// The call of an all_gather over its output list / a reduce_scatter over its
// input list (`ref`: the input / output).
OpCall blockListCall(const std::vector<at::Tensor>& list, const at::Tensor& ref, int redop = -1);
int redOpCode(const ::c10d::ReduceOp& op);

}  // namespace smdccl
