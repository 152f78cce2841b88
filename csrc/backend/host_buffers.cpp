// Host-memory data movement shared by the collectives (see host_buffers.h).
#include "backend/host_buffers.h"

#include <cstring>

#include "backend/arg_checks.h"

namespace smdccl {

// Copies tensors into / out of consecutive blocks of a flat buffer. An empty
// tensor's data_ptr() is null, and memcpy's pointers must never be (even for
// 0 bytes): skip those.
void packInto(char* dst, const std::vector<at::Tensor>& ts) {
  for (const auto& t : ts) {
    if (t.nbytes()) std::memcpy(dst, t.data_ptr(), t.nbytes());
    dst += t.nbytes();
  }
}
void unpackFrom(const char* src, std::vector<at::Tensor>& ts) {
  for (auto& t : ts) {
    if (t.nbytes()) std::memcpy(t.data_ptr(), src, t.nbytes());
    src += t.nbytes();
  }
}

// Allgathers several inputs as one message (rank r's block is its inputs
// packed); `place(i, r)` says where input i of rank r goes.
void allgatherPacked(Comm& c, const std::vector<at::Tensor>& ins, const Tuning& tuning,
                     const std::function<char*(size_t, int)>& place) {
  size_t each = 0;
  for (auto& t : ins) each += t.nbytes();
  at::Tensor flat = at::empty({static_cast<int64_t>(each * c.size())}, at::kByte);
  packInto(bytesOf(flat) + each * c.rank(), ins);
  smdccl::allgather(c, bytesOf(flat), Blocks::equal(c.size(), each), tuning);
  for (int r = 0; r < c.size(); ++r) {
    const char* src = bytesOf(flat) + each * r;
    for (size_t i = 0; i < ins.size(); ++i) {
      if (ins[i].nbytes()) std::memcpy(place(i, r), src, ins[i].nbytes());
      src += ins[i].nbytes();
    }
  }
}

// gather's data movement: every rank's `in` into world_size consecutive
// blocks of `out` on the root (nullptr elsewhere). The root's own block is
// copied here unless `in` already is that block (in place).
void gatherInto(Comm& c, const at::Tensor& in, char* out, int root) {
  size_t each = in.nbytes();
  if (c.rank() != root) {
    directGather(c, {.in = bytesOf(in), .bytes = each, .root = root});
    return;
  }
  char* mine = out + each * static_cast<size_t>(root);
  if (each && mine != bytesOf(in)) std::memcpy(mine, bytesOf(in), each);
  Blocks blocks = Blocks::equal(c.size(), each);
  directGather(c, {.in = bytesOf(in), .out = out, .bytes = each, .blocks = &blocks, .root = root});
}

bool overlaps(const at::Tensor& a, const at::Tensor& b) {
  auto* a0 = bytesOf(a);
  auto* b0 = bytesOf(b);
  return a.nbytes() && b.nbytes() && a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace smdccl
