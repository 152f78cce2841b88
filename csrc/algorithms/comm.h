#pragma once
// The view of a group an algorithm runs against: ranks, links, the ring
// order, the running op's context. Algorithms work on raw bytes.
#include <cstddef>
#include <vector>

#include "algorithms/exchange.h"
#include "algorithms/op_context.h"
#include "transport/mesh.h"

namespace smdccl {

struct Comm {
  Mesh& mesh;
  OpContext ctx;
  const std::vector<int>& ring;  // ranks in ring order (node-major)

  int rank() const { return mesh.rank(); }
  int size() const { return mesh.size(); }
  Link& link(int peer) { return mesh.link(peer, ctx.deadline); }
  Exchange exchange() { return Exchange(ctx, mesh.myBell(), mesh.shmNode()); }
  int ringPosition() const;
};

// Byte ranges of a buffer, one per group rank.
struct Blocks {
  std::vector<size_t> offset;
  std::vector<size_t> length;
  // `count` elements split as evenly as possible over `parts` ranks.
  static Blocks even(size_t count, int parts, size_t elemSize);
  // Consecutive blocks of the given byte lengths.
  static Blocks fromLengths(const std::vector<size_t>& lengths);
  size_t total() const;
};

// ---- allreduce family (ring.cpp, recursive_doubling.cpp) ----
// On return block r of buf holds the reduction of every rank's block r, on rank r.
void ringReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op);
// On entry block rank() of buf holds this rank's data; on return all blocks are filled.
void ringAllgather(Comm& c, char* buf, const Blocks& b);
void ringAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op);
void recursiveDoublingAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op);

// ---- one-to-all, all-to-one, all-to-all (broadcast.cpp, direct.cpp) ----
void treeBroadcast(Comm& c, char* buf, size_t bytes, int root);
void chainBroadcast(Comm& c, char* buf, size_t bytes, int root);
// Every rank sends its block to every other rank in one round.
void directAllgather(Comm& c, char* buf, const Blocks& b);
// sendBlocks index the input by destination, recvBlocks the output by source.
void directAlltoall(Comm& c, const char* in, const Blocks& sendBlocks, char* out,
                    const Blocks& recvBlocks);
// Root receives block r of `out` from rank r (its own block is copied by the caller).
void directGather(Comm& c, const char* in, size_t bytes, char* out, const Blocks& b, int root);
void directScatter(Comm& c, const char* in, const Blocks& b, char* out, size_t bytes, int root);

}  // namespace smdccl
