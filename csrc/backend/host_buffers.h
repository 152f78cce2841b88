#pragma once
// Host-memory data movement shared by the collectives' bodies: flat packing
// of several tensors, packed allgathers, gather into consecutive blocks.
#include <ATen/ATen.h>

#include <cstddef>
#include <functional>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/comm.h"

namespace smdccl {

// Copies tensors into / out of consecutive blocks of a flat buffer.
void packInto(char* dst, const std::vector<at::Tensor>& ts);
void unpackFrom(const char* src, std::vector<at::Tensor>& ts);
// Allgathers several inputs as one message (rank r's block is its inputs
// packed); `place(i, r)` says where input i of rank r goes.
void allgatherPacked(Comm& c, const std::vector<at::Tensor>& ins, const Tuning& tuning,
                     const std::function<char*(size_t, int)>& place);
// gather's data movement: every rank's `in` into world_size consecutive
// blocks of `out` on the root (nullptr elsewhere).
void gatherInto(Comm& c, const at::Tensor& in, char* out, int root);
// Whether two tensors share bytes.
bool overlaps(const at::Tensor& a, const at::Tensor& b);

}  // namespace smdccl
