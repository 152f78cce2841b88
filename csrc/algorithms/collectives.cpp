#include "algorithms/collectives.h"

#include "common/log.h"

namespace smdccl {

void allreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op, const Tuning& t) {
  if (c.size() == 1 || count == 0) return;
  AllreduceAlgo a = pickAllreduce(count * elementSize(dt), c.size(), t);
  SMDCCL_TRACE(c.ctx.describe(), ": ", count, " x ", dtypeName(dt), " ", redOpName(op), " -> ",
               algoName(a));
  if (a == AllreduceAlgo::Ring) ringAllreduce(c, buf, count, dt, op);
  else recursiveDoublingAllreduce(c, buf, count, dt, op);
}

void reduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op, const Tuning& t) {
  if (c.size() == 1) return;
  size_t total = b.total();
  if (pickAllreduce(total, c.size(), t) == AllreduceAlgo::RecursiveDoubling && !t.forced) {
    // Tiny: one latency-optimal allreduce of everything beats p-1 ring steps.
    recursiveDoublingAllreduce(c, buf, total / elementSize(dt), dt, op);
    return;
  }
  ringReduceScatter(c, buf, b, dt, op);
}

void allgather(Comm& c, char* buf, const Blocks& b, const Tuning& t) {
  if (c.size() == 1) return;
  if (useDirectAllgather(b.total(), c.size(), t)) directAllgather(c, buf, b);
  else ringAllgather(c, buf, b);
}

void broadcast(Comm& c, char* buf, size_t bytes, int root, const Tuning& t) {
  if (c.size() == 1) return;
  if (useTreeBroadcast(bytes, c.size(), t)) treeBroadcast(c, buf, bytes, root);
  else chainBroadcast(c, buf, bytes, root);
}

void barrier(Comm& c) {
  char token = 0;
  recursiveDoublingAllreduce(c, &token, 1, DType::U8, RedOp::Max);
}

}  // namespace smdccl
