// Ring reduce-scatter and allgather (bandwidth-optimal: each rank sends and
// receives (p-1)/p of the data per phase). The ring follows the node-major
// order, so it crosses each node boundary once per direction.
#include "algorithms/comm.h"

namespace smdccl {

// Position i of the ring finishes the reduce-scatter owning logical block
// (i+1) mod p; logical block k is mapped to the data block of the rank at ring
// position k-1, so every rank ends up owning its own data block.
static int dataBlockOf(const Comm& c, int logical) {
  int p = c.size();
  return c.ring[(logical - 1 + p) % p];
}

void ringReduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op) {
  int p = c.size();
  if (p == 1) return;
  int i = c.ringPosition();
  Link& next = c.link(c.ring[(i + 1) % p]);
  Link& prev = c.link(c.ring[(i - 1 + p) % p]);
  Exchange ex = c.exchange();
  for (int s = 0; s < p - 1; ++s) {
    int sendBlk = dataBlockOf(c, ((i - s) % p + p) % p);
    int recvBlk = dataBlockOf(c, ((i - s - 1) % p + p) % p);
    ex.send(next, buf + b.offset[sendBlk], b.length[sendBlk])
        .recvReduce(prev, buf + b.offset[recvBlk], b.length[recvBlk], dt, op)
        .run();
  }
}

void ringAllgather(Comm& c, char* buf, const Blocks& b) {
  int p = c.size();
  if (p == 1) return;
  int i = c.ringPosition();
  Link& next = c.link(c.ring[(i + 1) % p]);
  Link& prev = c.link(c.ring[(i - 1 + p) % p]);
  Exchange ex = c.exchange();
  for (int s = 0; s < p - 1; ++s) {
    int sendBlk = dataBlockOf(c, ((i + 1 - s) % p + p) % p);
    int recvBlk = dataBlockOf(c, ((i - s) % p + p) % p);
    ex.send(next, buf + b.offset[sendBlk], b.length[sendBlk])
        .recv(prev, buf + b.offset[recvBlk], b.length[recvBlk])
        .run();
  }
}

void ringAllreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op) {
  Blocks b = Blocks::even(count, c.size(), elementSize(dt));
  ringReduceScatter(c, buf, b, dt, op);
  ringAllgather(c, buf, b);
}

}  // namespace smdccl
