#include "algorithms/staged_ring.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <optional>
#include <functional>
#include <vector>

#include "common/error.h"

namespace smdccl {

namespace {

// Chunks scheduled per exchange run (a bubble of one piece between runs).
constexpr size_t kWindowChunks = 4;

// What one staged ring moves: its chunks (each one ring over c.size()
// blocks of `buf`) and its phases.
struct RingChunks {
  char* buf;
  DType dt;
  RedOp op;
  bool reduceScatter = true;
  bool allgather = true;
  size_t chunks = 1;
  // Chunk j's blocks, offsets from buf.
  std::function<Blocks(size_t j)> blocksOf;
};

class StagedRing final : public StagedProxy {
 public:
  StagedRing(Comm& c, StageDevice& d, RingChunks job, char* slots, const StagePlan& plan)
      : c_(c), d_(d), job_(std::move(job)), dt_(job_.dt), op_(job_.op), plan_(plan) {
    const DType dt = job_.dt;
    const int p = c.size();
    const int i = c.ringPosition();
    next_ = c.ring[(i + 1) % p];
    prev_ = c.ring[(i - 1 + p) % p];
    const bool f32 = dt == DType::F32;
    sendWire_ = f32 ? c.wireTo(next_) : Wire::F32;
    recvWire_ = f32 ? c.wireTo(prev_) : Wire::F32;
    es_ = elementSize(dt);
    // Pieces are cut in device elements, the same on both ends of a hop
    // whatever its wire (a 16-bit wire fills half of each slot).
    pieceElems_ = std::max<size_t>(1, plan.slotBytes / es_);
    sendSlots_ = slots;
    recvSlots_ = slots + static_cast<size_t>(plan.slots) * plan.slotBytes;
    walk(/*planning=*/true);
  }

  // A failed op lets go of what it planned and never ran.
  ~StagedRing() override {
    if (!ran_) d_.abandon();
  }

  void run() override {
    try {
      walk(/*planning=*/false);
    } catch (...) {
      d_.abandon();
      throw;
    }
    ran_ = true;
  }

 private:
  // Walks every chunk's ring in schedule order: planning, every device copy
  // is planned (a gated device queues it); running, the exchange gets the
  // transfers and lets each planned copy go once what it needs is there.
  void walk(bool planning) {
    planning_ = planning;
    const int p = c_.size();
    const int i = c_.ringPosition();
    const Wire roundLast = c_.resultWire(dt_);
    sendTurn_ = recvTurn_ = 0;
    if (!planning) ex_.emplace(c_.ctx, c_.mesh.myBell(), c_.mesh.shmNode(), c_.book);
    sendFree_.assign(plan_.slots, -1);
    recvFree_.assign(plan_.slots, -1);
    size_t inWindow = 0;
    for (size_t j = 0; j < job_.chunks; ++j) {
      // One ring per chunk; the chunks share the slots and stream together,
      // kWindowChunks per exchange run: each pass of the exchange walks its
      // open transfers, so a whole large message in one run would cost
      // CPU on every pass.
      if (!planning && inWindow == kWindowChunks) {
        ex_->run();
        std::fill(sendFree_.begin(), sendFree_.end(), -1);  // indices of the finished run
        std::fill(recvFree_.begin(), recvFree_.end(), -1);
        inWindow = 0;
      }
      ++inWindow;
      blocks_ = job_.blocksOf(j);
      written_.assign(p, {});
      read_.assign(p, {});
      for (int b = 0; b < p; ++b) {
        written_[b].assign(piecesOf(b), -1);
        read_[b].assign(piecesOf(b), -1);
      }
      // Reduce-scatter: step s sends logical block i-s and reduces block i-s-1.
      if (job_.reduceScatter)
        for (int s = 0; s < p - 1; ++s)
          step(ringDataBlock(c_, i - s), ringDataBlock(c_, i - s - 1), true,
               s == p - 2 ? roundLast : Wire::F32);
      // Allgather: step s sends block i+1-s (our own first) and receives block i-s.
      if (job_.allgather)
        for (int s = 0; s < p - 1; ++s)
          step(ringDataBlock(c_, i + 1 - s), ringDataBlock(c_, i - s), false, Wire::F32);
    }
    if (!planning) ex_->run();
  }

  size_t piecesOf(int block) const {
    size_t n = blocks_.length[block] / es_;
    return (n + pieceElems_ - 1) / pieceElems_;
  }
  size_t elemsOf(int block, size_t k) const {
    return std::min(pieceElems_, blocks_.length[block] / es_ - k * pieceElems_);
  }
  char* at(int block, size_t k) const {
    return job_.buf + blocks_.offset[block] + k * pieceElems_ * es_;
  }
  // The next planned copy, as an exchange step that lets it go.
  int deviceStep(Exchange::Deps deps) {
    const StageDevice::Ticket t = tickets_.front();
    tickets_.pop_front();
    return ex_->device(
        d_,
        [this, t] {
          d_.go(t);
          return t;
        },
        deps);
  }

  // One ring step, piece by piece, one copy out ahead: out 0, then out
  // k+1 before in k. Planned in that order, a copy out that waits (through
  // the slots and the link) for the peer's earlier copies in comes after
  // them in every lane, so lanes that share one queue never stop behind a
  // gate that waits for work queued later; and the next piece's copy out
  // goes while this piece's copy in waits for the network.
  void step(int sendBlock, int recvBlock, bool reduce, Wire roundTo) {
    const size_t sends = piecesOf(sendBlock), recvs = piecesOf(recvBlock);
    if (sends > 0) sendPiece(sendBlock, 0);
    for (size_t k = 0; k < std::max(sends, recvs); ++k) {
      if (k + 1 < sends) sendPiece(sendBlock, k + 1);
      if (k < recvs) recvPiece(recvBlock, k, reduce, roundTo);
    }
  }

  void sendPiece(int block, size_t k) {
    const size_t n = elemsOf(block, k);
    const int s = static_cast<int>(sendTurn_++ % plan_.slots);
    char* slot = sendSlots_ + s * plan_.slotBytes;
    if (planning_) {
      tickets_.push_back(d_.planToHost(slot, at(block, k), n, dt_, sendWire_));
      return;
    }
    // The piece is final here once its last write (an earlier step's
    // receive) has landed, and the slot is free once its last send left.
    int packed = deviceStep({ex_->join(written_[block][k], sendFree_[s]), -1});
    read_[block][k] = packed;
    ex_->send(c_.link(next_), slot, n * StageDevice::wireElementSize(dt_, sendWire_), {packed, -1});
    sendFree_[s] = ex_->size() - 1;
  }

  void recvPiece(int block, size_t k, bool reduce, Wire roundTo) {
    const size_t n = elemsOf(block, k);
    const int s = static_cast<int>(recvTurn_++ % plan_.slots);
    char* slot = recvSlots_ + s * plan_.slotBytes;
    if (planning_) {
      tickets_.push_back(d_.planFromHost(
          at(block, k), slot, n,
          {.dt = dt_, .wire = recvWire_, .reduce = reduce, .op = op_, .roundTo = roundTo}));
      return;
    }
    ex_->recv(c_.link(prev_), slot, n * StageDevice::wireElementSize(dt_, recvWire_),
              {recvFree_[s], -1});
    int got = ex_->size() - 1;
    // After the piece's last write, and after its last read: the
    // allgather overwrites what the reduce-scatter packed (the ring's
    // data flow orders them too; this keeps it local).
    int landed = deviceStep({ex_->join(got, ex_->join(written_[block][k], read_[block][k])), -1});
    recvFree_[s] = landed;
    written_[block][k] = landed;
  }

  Comm c_;  // a copy: the proxy may run after the caller's Comm is gone
  StageDevice& d_;
  RingChunks job_;
  DType dt_;
  RedOp op_;
  StagePlan plan_;
  std::optional<Exchange> ex_;  // made by run()
  bool planning_ = true, ran_ = false;
  // The planned copies, in walk order, until run() lets them go.
  std::deque<StageDevice::Ticket> tickets_;
  int next_ = 0, prev_ = 0;
  Wire sendWire_ = Wire::F32, recvWire_ = Wire::F32;
  size_t es_ = 1, pieceElems_ = 1;
  // The chunk being scheduled: its ring's blocks.
  Blocks blocks_;
  char* sendSlots_ = nullptr;
  char* recvSlots_ = nullptr;
  size_t sendTurn_ = 0, recvTurn_ = 0;
  // Per slot: the exchange index after which it may be filled again.
  std::vector<int> sendFree_, recvFree_;
  // Per block and piece of the chunk: the device steps that last wrote and
  // last read it (-1: none).
  std::vector<std::vector<int>> written_, read_;
};

}  // namespace

namespace {
void checkPlan(const StagePlan& plan, DType dt) {
  SMDCCL_CHECK_ARG(plan.slots >= 1 && plan.slotBytes >= elementSize(dt),
                   "staged ring: need at least one slot of one element (slots ", plan.slots,
                   ", slot bytes ", plan.slotBytes, ")");
}
}  // namespace

std::unique_ptr<StagedProxy> planStagedRingAllreduce(Comm& c, StageDevice& device,
                                                     const CollectiveArgs& a, char* slots,
                                                     const StagePlan& plan) {
  checkPlan(plan, a.dt);
  if (a.count == 0 || c.size() == 1) return nullptr;
  const size_t es = elementSize(a.dt), count = a.count;
  const size_t chunk = plan.chunkBytes ? std::max<size_t>(1, plan.chunkBytes / es) : count;
  const int p = c.size();
  RingChunks job{.buf = a.buf,
                 .dt = a.dt,
                 .op = a.op,
                 .chunks = (count + chunk - 1) / chunk,
                 .blocksOf = [=](size_t j) {
                   // Even blocks of the chunk's elements, as the host ring cuts them.
                   const size_t at = j * chunk;
                   Blocks b = Blocks::even(std::min(chunk, count - at), p, es);
                   for (size_t& o : b.offset) o += at * es;
                   return b;
                 }};
  return std::make_unique<StagedRing>(c, device, std::move(job), slots, plan);
}

std::unique_ptr<StagedProxy> planStagedRingReduceScatter(Comm& c, StageDevice& device,
                                                         const RingBlocks& r, char* slots,
                                                         const StagePlan& plan) {
  checkPlan(plan, r.dt);
  if (r.each == 0 || c.size() == 1) return nullptr;
  const size_t es = elementSize(r.dt), each = r.each;
  const int p = c.size();
  // Every rank's block cut alike: chunk j is the same slice of each block.
  const size_t chunk =
      plan.chunkBytes ? std::max<size_t>(1, plan.chunkBytes / (es * static_cast<size_t>(p))) : each;
  RingChunks job{.buf = r.buf,
                 .dt = r.dt,
                 .op = r.op,
                 .allgather = false,
                 .chunks = (each + chunk - 1) / chunk,
                 .blocksOf = [=](size_t j) {
                   const size_t at = j * chunk, n = std::min(chunk, each - at);
                   Blocks b;
                   for (int q = 0; q < p; ++q) {
                     b.offset.push_back((static_cast<size_t>(q) * each + at) * es);
                     b.length.push_back(n * es);
                   }
                   return b;
                 }};
  return std::make_unique<StagedRing>(c, device, std::move(job), slots, plan);
}

void stagedRingAllreduce(Comm& c, StageDevice& device, const CollectiveArgs& a, char* slots,
                         const StagePlan& plan) {
  if (auto proxy = planStagedRingAllreduce(c, device, a, slots, plan)) proxy->run();
}

void stagedRingReduceScatter(Comm& c, StageDevice& device, const RingBlocks& r, char* slots,
                             const StagePlan& plan) {
  if (auto proxy = planStagedRingReduceScatter(c, device, r, slots, plan)) proxy->run();
}

}  // namespace smdccl
