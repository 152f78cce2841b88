// Argument checks and call signatures shared by the collectives'
// c10d entry points (see call_checks.h).
#include "backend/call_checks.h"

#include <algorithm>

#include "backend/arg_checks.h"
#include "common/hash.h"

namespace smdccl {

void checkOnePerRank(const std::vector<at::Tensor>& list, int size, const char* opName,
                     const char* what) {
  TORCH_CHECK_VALUE(static_cast<int>(list.size()) == size, "smdccl: ", opName, ": ", what,
                    " must hold one tensor per rank (", size, "), got ", list.size());
}

void checkOutputList(const std::vector<at::Tensor>& list, const at::Tensor& ref, int size,
                     const char* opName, const char* what) {
  checkOnePerRank(list, size, opName, what);
  for (size_t i = 0; i < list.size(); ++i)
    checkSameShapeAndType(list[i], ref, opName, strCat(what, "[", i, "]"));
}

// all_gather's output list / reduce_scatter's input list, which may be
// uneven (as with NCCL): one tensor per rank, of `ref`'s dtype; this rank's
// own block has `ref`'s element count. Returns their byte blocks.
Blocks checkBlockList(const std::vector<at::Tensor>& list, const at::Tensor& ref,
                      const CheckedCall& call, const char* what, const char* refName) {
  const char* opName = call.opName;
  const int rank = call.rank, size = call.size;
  checkOnePerRank(list, size, opName, what);
  std::vector<size_t> lengths;
  for (size_t i = 0; i < list.size(); ++i) {
    std::string name = strCat(what, "[", i, "]");
    checkTensor(list[i], opName, name.c_str());
    TORCH_CHECK_VALUE(list[i].scalar_type() == ref.scalar_type(), "smdccl: ", opName, ": ", name,
                      " has dtype ", list[i].scalar_type(), " but the ", refName, " has ",
                      ref.scalar_type());
    lengths.push_back(list[i].nbytes());
  }
  TORCH_CHECK_VALUE(list[static_cast<size_t>(rank)].numel() == ref.numel(), "smdccl: ", opName,
                    ": ", what, "[", rank, "] (this rank's block) has ",
                    list[static_cast<size_t>(rank)].numel(), " elements but the ", refName, " has ",
                    ref.numel());
  return Blocks::fromLengths(lengths);
}

// The c10d signatures nest a per-rank tensor list inside one list per
// device of the process (one here): torch passes [tensor_list], with
// tensor_list[r] for rank r. One-tensor lists, one per rank, are that
// layout transposed: named so, with the fix.
void checkOneList(const std::vector<std::vector<at::Tensor>>& lists, int size, const char* opName,
                  const char* name) {
  if (lists.size() == 1) return;
  bool transposed =
      lists.size() == static_cast<size_t>(size) && size > 1 &&
      std::all_of(lists.begin(), lists.end(), [](const auto& l) { return l.size() == 1; });
  TORCH_CHECK_VALUE(false, "smdccl: ", opName, ": expected one ", name, " (torch's layout: [", name,
                    "], ", name, "[r] for rank r), got ", lists.size(), " lists",
                    transposed ? "; they hold one tensor per rank each, which is that layout "
                                 "transposed: pass [[l[0] for l in lists]]"
                               : "");
}

// gather's gather_list / scatter's scatter_list: one tensor per rank on the
// root, nothing elsewhere.
std::vector<at::Tensor> rootList(const std::vector<std::vector<at::Tensor>>& lists,
                                 const at::Tensor& ref, const CheckedCall& call, int root,
                                 const char* name) {
  const char* opName = call.opName;
  const int rank = call.rank, size = call.size;
  if (rank != root) {
    TORCH_CHECK_VALUE(lists.empty() || lists[0].empty(), "smdccl: ", opName,
                      ": only the root (rank ", root, ") passes ", name);
    return {};
  }
  checkOneList(lists, size, opName, name);
  checkOutputList(lists[0], ref, size, opName, name);
  return lists[0];
}

// all_gather_coalesced's output_tensor_lists in torch's layout (gloo's and
// NCCL's): one list per rank, output_tensor_lists[r][i] receiving rank r's
// input i. Lists given the other way round (one list per input, one tensor
// per rank) are named as such, with the fix: when world_size equals the
// number of inputs and the shapes agree the two cannot be told apart.
void checkPerRankLists(const std::vector<std::vector<at::Tensor>>& lists,
                       const std::vector<at::Tensor>& inputs, int size, const char* opName) {
  auto fits = [&](size_t outer, size_t inner, bool transposed) {
    if (lists.size() != outer) return false;
    for (size_t a = 0; a < lists.size(); ++a) {
      if (lists[a].size() != inner) return false;
      for (size_t b = 0; b < lists[a].size(); ++b) {
        const at::Tensor& t = lists[a][b];
        const at::Tensor& in = inputs[transposed ? a : b];
        if (!t.defined() || t.numel() != in.numel() || t.scalar_type() != in.scalar_type())
          return false;
      }
    }
    return true;
  };
  size_t n = inputs.size(), ranks = static_cast<size_t>(size);
  if (fits(ranks, n, /*transposed=*/false)) return;  // each tensor's own checks follow
  const char* layout =
      "torch's layout (gloo's and NCCL's) is one list per rank, output_tensor_lists[r][i] "
      "receiving rank r's input_tensor_list[i]";
  if (fits(n, ranks, /*transposed=*/true))
    TORCH_CHECK_VALUE(false, "smdccl: ", opName,
                      ": output_tensor_lists holds one list per input tensor (", n,
                      ") of one tensor per rank (", size, "): the transpose of ", layout,
                      "; pass [list(t) for t in zip(*output_tensor_lists)]");
  TORCH_CHECK_VALUE(lists.size() == ranks, "smdccl: ", opName,
                    ": output_tensor_lists must hold one list per rank (", size, "), got ",
                    lists.size(), "; ", layout);
  for (size_t r = 0; r < lists.size(); ++r)
    TORCH_CHECK_VALUE(lists[r].size() == n, "smdccl: ", opName, ": output_tensor_lists[", r,
                      "] must hold one tensor per input tensor (", n, "), got ", lists[r].size(),
                      "; ", layout);
}

// The signature of a call (what every rank must pass alike) and the inputs
// whose contents it sends. `count`: elements each rank passes, or kAnyCount.
OpCall callOf(std::vector<at::Tensor> inputs, at::ScalarType dt, uint64_t count, int redop,
              int root) {
  OpCall call;
  call.sig.dtype = static_cast<int>(dt);
  call.sig.dtypeName = c10::toString(dt);
  call.sig.redop = redop;
  call.sig.root = root;
  call.sig.count = count;
  if (count != OpSignature::kAnyCount) {
    // Shapes, for the full fingerprint (FNV-1a over every input's sizes).
    Fnv1a h;
    for (const auto& t : inputs) {
      h.mix(static_cast<uint64_t>(t.dim()));
      for (int64_t d : t.sizes()) h.mix(static_cast<uint64_t>(d));
    }
    call.sig.shapeHash = h.value;
  }
  call.inputs = std::move(inputs);
  return call;
}

uint64_t numelOf(const std::vector<at::Tensor>& ts) {
  uint64_t n = 0;
  for (const auto& t : ts) n += static_cast<uint64_t>(t.numel());
  return n;
}

// The call of an all_gather over the output list / a reduce_scatter over the
// input list `list` (`ref`: the input / output): an even list is described
// by one block's count, an uneven one by the total, fingerprinted (DETAIL)
// by every block's shape, so that ranks that disagree on any block's size
// get a mismatch error.
OpCall blockListCall(const std::vector<at::Tensor>& list, const at::Tensor& ref, int redop) {
  bool even = std::all_of(list.begin(), list.end(),
                          [&](const at::Tensor& t) { return t.numel() == ref.numel(); });
  if (even) return callOf({ref}, ref.scalar_type(), ref.numel(), redop);
  OpCall call = callOf(list, ref.scalar_type(), numelOf(list), redop);
  call.inputs = {ref};
  return call;
}

int redOpCode(const ::c10d::ReduceOp& op) { return static_cast<int>(op.op_); }

}  // namespace smdccl
