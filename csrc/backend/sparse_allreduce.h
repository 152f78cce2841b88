#pragma once
// all_reduce of a sparse COO tensor, as gloo offers it (DDP with
// nn.Embedding(sparse=True) sends its gradients this way). Ranks hold
// different numbers of entries, so nothing can be reduced on the wire: the
// ranks allgather their coalesced indices and values and every rank sums the
// same concatenation locally, so all end with the same bits.
#include <ATen/ATen.h>

#include "algorithms/comm.h"
#include "algorithms/tuning.h"

namespace smdccl {

// `t`: a CPU sparse COO tensor of the same shape on every rank. On return it
// holds the coalesced sum over c's ranks (divided by c.size() when
// `average`). Ranks whose shapes disagree all raise the same
// InvalidArgument, naming every rank's shape, before any entries move.
void sparseAllreduce(Comm& c, at::Tensor& t, bool average, const Tuning& tuning);

}  // namespace smdccl
