#pragma once
// Drives a set of sends and receives on links concurrently until all are
// done: the one place where algorithms wait. Waiting spins, then yields,
// then sleeps (futex doorbell for shared memory, poll() for sockets), checks
// the deadline and whether same-node peers are alive, and reports which
// peer it was waiting for.
#include <vector>

#include "algorithms/op_context.h"
#include "transport/futex.h"
#include "transport/link.h"
#include "transport/shm_node.h"

namespace smdccl {

class Exchange {
 public:
  // `node`: this rank's shared-memory node, if any; its ranks are checked for
  // liveness while waiting.
  Exchange(const OpContext& ctx, Doorbell* myBell, const ShmNode* node = nullptr)
      : ctx_(ctx), bell_(myBell), node_(node) {}

  Exchange& send(Link& link, const void* buf, size_t bytes);
  Exchange& recv(Link& link, void* buf, size_t bytes);
  // Incoming bytes are combined into buf: buf = buf op incoming.
  Exchange& recvReduce(Link& link, void* buf, size_t bytes, DType dtype, RedOp op);
  // Runs everything added since the last run() to completion.
  void run();

 private:
  enum class Kind { Send, Recv, RecvReduce };
  struct Transfer {
    Link* link;
    Kind kind;
    char* buf;
    size_t bytes;
    size_t done;
    DType dtype;
    RedOp op;
  };
  bool progressOnce(bool* allDone);
  void sleepForProgress();
  void checkHealth();
  [[noreturn]] void timeout();

  const OpContext& ctx_;
  Doorbell* bell_;
  const ShmNode* node_;
  std::vector<Transfer> t_;
};

}  // namespace smdccl
