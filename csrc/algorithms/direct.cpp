// One-round algorithms: every transfer of the collective is posted at once
// and the exchange moves them concurrently (no ordering deadlocks, all links
// busy).
#include <cstring>

#include "algorithms/comm.h"

namespace smdccl {

void directAllgather(Comm& c, char* buf, const Blocks& b) {
  int me = c.rank();
  Exchange ex = c.exchange();
  for (int r = 0; r < c.size(); ++r) {
    if (r == me) continue;
    ex.send(c.link(r), buf + b.offset[me], b.length[me]);
    ex.recv(c.link(r), buf + b.offset[r], b.length[r]);
  }
  ex.run();
}

void directAlltoall(Comm& c, const char* in, const Blocks& sendBlocks, char* out,
                    const Blocks& recvBlocks) {
  int me = c.rank();
  if (recvBlocks.length[me])
    std::memmove(out + recvBlocks.offset[me], in + sendBlocks.offset[me], recvBlocks.length[me]);
  Exchange ex = c.exchange();
  for (int r = 0; r < c.size(); ++r) {
    if (r == me) continue;
    ex.send(c.link(r), in + sendBlocks.offset[r], sendBlocks.length[r]);
    ex.recv(c.link(r), out + recvBlocks.offset[r], recvBlocks.length[r]);
  }
  ex.run();
}

void directGather(Comm& c, const char* in, size_t bytes, char* out, const Blocks& b, int root) {
  Exchange ex = c.exchange();
  if (c.rank() == root) {
    for (int r = 0; r < c.size(); ++r)
      if (r != root) ex.recv(c.link(r), out + b.offset[r], b.length[r]);
  } else {
    ex.send(c.link(root), in, bytes);
  }
  ex.run();
}

void directScatter(Comm& c, const char* in, const Blocks& b, char* out, size_t bytes, int root) {
  Exchange ex = c.exchange();
  if (c.rank() == root) {
    for (int r = 0; r < c.size(); ++r)
      if (r != root) ex.send(c.link(r), in + b.offset[r], b.length[r]);
  } else {
    ex.recv(c.link(root), out, bytes);
  }
  ex.run();
}

}  // namespace smdccl
