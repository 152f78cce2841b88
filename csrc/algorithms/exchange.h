#pragma once
// Drives a set of sends and receives on links concurrently until all are
// done: the one place where algorithms wait. Waiting spins, then yields,
// then sleeps (futex doorbell for shared memory, poll() for sockets), checks
// the deadline and whether same-node peers are alive, and reports which
// peer it was waiting for.
#include <cstdint>
#include <functional>
#include <vector>

#include "common/dtype.h"
#include "kernels/cpu/reduce.h"

#include "algorithms/exchange_book.h"
#include "common/op_context.h"
#include "transport/futex.h"
#include "transport/link.h"
#include "transport/shm_node.h"

namespace smdccl {

// Transfers on one link in one direction run in the order they were added:
// a message never interleaves with the one before it (both sides add their
// halves in the same order, so each receive matches its send).
//
// Optional ordering between the transfers of one exchange, by index (the
// value of Exchange::size() before the transfer was added):
//  after:   the transfer starts once that one has completed (data produced
//           by another transfer, e.g. another level of a two-level scheme);
//  limitBy: the transfer moves no further than that one has (a send that
//           forwards what a receive is still writing, while it is hot).
struct ExchangeDeps {
  int after = -1;
  int limitBy = -1;
};

class Exchange {
 public:
  // `node`: this rank's shared-memory node, if any; its ranks are checked for
  // liveness while waiting.
  // `book`: the group's per-peer state (op headers, TCP reduce staging),
  // kept from one op to the next; without one (a test's lone exchange) the
  // exchange keeps its own. Neither copied nor moved (book_ may point into
  // it): Comm::exchange() returns it by guaranteed copy elision.
  Exchange(const OpContext& ctx, Doorbell* myBell, const ShmNode* node = nullptr,
           ExchangeBook* book = nullptr)
      : ctx_(ctx), bell_(myBell), node_(node), book_(book ? book : &ownBook_) {}
  Exchange(const Exchange&) = delete;
  Exchange& operator=(const Exchange&) = delete;

  using Deps = ExchangeDeps;

  // `bytes` always counts buf's bytes. With a 16-bit `wire`, buf holds
  // float32 and the link carries it rounded to fp16/bf16 (half the bytes):
  // the cast is fused into the send and the receive, never a separate pass.
  Exchange& send(Link& link, const void* buf, size_t bytes, Deps deps = {}, Wire wire = Wire::F32);
  Exchange& recv(Link& link, void* buf, size_t bytes, Deps deps = {}, Wire wire = Wire::F32);
  // How recvReduce combines incoming bytes into buf: buf = from op incoming,
  // `from` being buf itself unless given (then left as it was: an
  // out-of-place reduce-scatter reads its input there), float32 arithmetic
  // for a 16-bit `wire`. `roundTo`: the sums are rounded to what that wire
  // delivers, so the rank holding a final result keeps exactly the value its
  // peers receive.
  struct Combine {
    DType dtype;
    RedOp op;
    Wire wire = Wire::F32;
    Wire roundTo = Wire::F32;
    const void* from = nullptr;
    // buf (not `from`) is not read again by this op: written around the
    // caches (reduceToStreaming). Plain elements only; a 16-bit wire ignores it.
    bool streamOut = false;
  };
  Exchange& recvReduce(Link& link, void* buf, size_t bytes, const Combine& how, Deps deps = {});
  // An index that finishes once both `a` and `b` have (-1: nothing to wait
  // for): what a schedule returns when its end is on several links.
  int join(int a, int b);
  int size() const { return static_cast<int>(t_.size()); }
  // Runs everything added since the last run() to completion.
  void run();

 private:
  enum class Kind { Send, Recv, RecvReduce, Join };
  struct Transfer {
    Link* link = nullptr;
    Kind kind = Kind::Send;
    char* buf = nullptr;
    size_t bytes = 0;
    size_t done = 0;
    const char* from = nullptr;  // RecvReduce: the first operand (nullptr: buf)
    bool streamOut = false;      // RecvReduce: Combine::streamOut
    DType dtype = DType::U8;
    RedOp op = RedOp::Sum;
    Deps deps{};
    int prevOnLink = -1;  // the transfer before this one on the same link and direction
    int after2 = -1;      // Join: the second transfer it waits for (deps.after the first)
    Wire wire = Wire::F32;
    Wire roundTo = Wire::F32;
    // 16-bit wire: packed elements in flight. A send's staging starts at
    // buffer offset stagedAt; stagedBytes of it are packed, movedBytes gone.
    // A receive's holds movedBytes received, not yet unpacked.
    std::vector<uint16_t> staging{};
    size_t stagedAt = 0, stagedBytes = 0, movedBytes = 0;
    // Set once done == bytes *and* its `after` has finished: a zero-length
    // transfer must not let its successors jump ahead of its predecessor.
    bool finished = false;
    // The op header (op_header.h) that opens this op's first message on the
    // link in this direction: moved ahead of the data, in the same message;
    // a received one is checked before any data is read.
    unsigned char* header = nullptr;
    size_t headerLeft = 0;
  };
  // Appends `t` (link, kind, buf, bytes, deps; dtype, op and wires where
  // they apply), after the last transfer on its link in its direction.
  Exchange& add(Transfer t);
  // A transfer's steps (plain bytes, or a 16-bit wire); return whether anything moved.
  bool move(Transfer& t);
  bool moveHeader(Transfer& t);
  void checkHeader(const Transfer& t) const;
  bool moveRaw(Transfer& t, size_t limit);
  // A receive-and-reduce of plain elements: in place from the link's
  // buffer, or through the peer's staging.
  size_t recvReduceSome(Transfer& t, size_t n);
  static FromWire wireCombine(const Transfer& t);  // a 16-bit RecvReduce's arithmetic
  bool moveWireSend(Transfer& t, size_t limit);
  bool moveWireRecv(Transfer& t, size_t limit);
  bool progressOnce(bool* allDone);
  // Its `after` and the message before it on its link have finished.
  bool depsDone(const Transfer& t) const;
  // How far it may move now (limitBy caps a forwarding send).
  size_t limitOf(const Transfer& t) const;
  // Not finished and free to move now (not held back by a dependency).
  bool canMove(const Transfer& t) const;
  void sleepForProgress();
  void checkHealth();
  [[noreturn]] void timeout();

  const OpContext& ctx_;
  Doorbell* bell_;
  const ShmNode* node_;
  std::vector<Transfer> t_;
  size_t firstOpen_ = 0;  // transfers before it have all finished
  struct LinkTail {
    Link* link;
    int lastSend, lastRecv;
  };
  std::vector<LinkTail> tails_;  // few links per exchange: a linear search is cheapest
  ExchangeBook ownBook_;
  ExchangeBook* book_;
};

}  // namespace smdccl
