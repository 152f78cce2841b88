#include "algorithms/staged_collectives.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "algorithms/collectives.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

namespace {
// Slots for `rounds` rounds: one each, up to kStagedRoundSlots in turn.
int slotsFor(size_t rounds) {
  return static_cast<int>(std::clamp<size_t>(rounds, 1, kStagedRoundSlots));
}
// The quantization scratch of c's group (a lone test Comm: `own`).
std::vector<char>& quantizedOf(const Comm& c, std::vector<char>& own) {
  return c.book ? c.book->quantized : own;
}

// Packed rounds: the device leaves n wire values at the start of a
// float32-sized slot region. Widened in place (from the end, a piece at a
// time, so that no value is overwritten before it is read), the host
// collective runs on float32, as it does for a host tensor.
constexpr size_t kPiece = 2048;
void widenInPlace(char* buf, size_t n, Wire wire) {
  float tmp[kPiece];
  for (size_t end = n; end > 0;) {
    const size_t m = std::min(kPiece, end), at = end - m;
    unpackFromWire(tmp, buf + at * 2, m, wire);
    std::memcpy(buf + at * 4, tmp, m * 4);
    end = at;
  }
}
// ... and narrowed back to the start of it (dst <= src), from the start:
// exact, as every result of a compressed Comm is the wire's already
// (Comm::resultWire).
void narrowInPlace(char* dst, const char* src, size_t n, Wire wire) {
  uint16_t tmp[kPiece];
  for (size_t at = 0; at < n; at += kPiece) {
    const size_t m = std::min(kPiece, n - at);
    packToWire(tmp, reinterpret_cast<const float*>(src + at * 4), m, wire);
    std::memcpy(dst + at * 2, tmp, m * 2);
  }
}
// The host step's reduction of a round: the int8 wire's exchange where c
// runs it across nodes (Comm::int8Across: the CUDA paths' step across
// nodes, whose Comm has no levels for the int8 algorithms' choice), else
// what a host tensor gets.
void allreduceSlot(Comm& c, const CollectiveArgs& a, const Tuning& t) {
  if (!c.int8Across(a.dt, a.op)) return allreduce(c, a, t);
  std::vector<char> own;
  int8AcrossAllreduce(c, a,
                      {.scratch = quantizedOf(c, own),
                       .feedback = c.int8Feedback,
                       .chunkBytes = t.pipelineChunkBytes});
}

void reduceScatterSlot(Comm& c, const CollectiveArgs& a, const Tuning& t) {
  if (!c.int8Across(a.dt, a.op)) return reduceScatter(c, a, t);
  std::vector<char> own;
  int8AcrossReduceScatter(c, a, {.scratch = quantizedOf(c, own), .feedback = c.int8Feedback});
}

// Where each rank's piece (counts[j] float32 values) sits in a slot packed
// for the int8 exchange across nodes: the others' quantized, this rank's
// float32, each from a 16-byte boundary (the host sums into this rank's
// float32 in place). Empty where some piece has fewer than 8 values (a
// quantized piece and its padding must take no more room than float32).
constexpr size_t kPieceAlign = 16;
Int8Slot int8SlotOf(const Comm& c, const std::vector<size_t>& counts) {
  Int8Slot s;
  size_t at = 0;
  for (int j = 0; j < c.size(); ++j) {
    if (counts[j] < 8) return {};
    s.counts.push_back(counts[j]);
    s.offsets.push_back(at);
    at += j == c.rank() ? counts[j] * sizeof(float) : int8Bytes(counts[j]);
    at = (at + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  }
  return s;
}

size_t int8SlotBytes(const Int8Slot& s) {
  const size_t last = s.counts.size() - 1;
  return s.offsets[last] + s.counts[last] * sizeof(float);  // room for float32 either way
}

// An allreduce round of values at `dev` packed as `s` says: out, the
// others' pieces quantized and this rank's as it is; back, every piece
// quantized (its owner's sum).
StagedRound int8AllreduceRound(const Comm& c, char* dev, const Int8Slot& s) {
  StagedRound round;
  size_t first = 0;
  for (int j = 0; j < c.size(); ++j) {
    const StagedRange piece{dev + first * sizeof(float), s.offsets[j], s.counts[j] * sizeof(float),
                            j != c.rank()};
    round.out.push_back(piece);
    round.in.push_back({piece.dev, piece.slotOffset, piece.bytes, true});
    first += s.counts[j];
  }
  round.host = [comm = c, s](char* slot) mutable {
    std::vector<char> own;
    int8AcrossPackedAllreduce(comm, slot, s, quantizedOf(comm, own));
  };
  return round;
}

}  // namespace

StagedRoundsJob allreduceRounds(const Comm& c, const CollectiveArgs& a, size_t chunkBytes,
                                const Tuning& t) {
  const size_t es = elementSize(a.dt);
  // A tensor under a chunk takes a slot of its own size, not a chunk's.
  const size_t chunk = std::min(std::max<size_t>(1, chunkBytes / es), std::max<size_t>(a.count, 1));
  const Wire wire = c.resultWire(a.dt);
  StagedRoundsJob job;
  job.slotBytes = chunk * es;
  job.slots = slotsFor((a.count + chunk - 1) / chunk);
  job.dt = a.dt;
  job.wire = wire;
  // int8 across nodes: the device quantizes the pieces the other nodes
  // own, once (the int8 pipeline's pieces of a chunk); the host runs the
  // exchange on them; every piece comes back quantized. With error
  // feedback the host quantizes instead, float32 staged: the residuals are
  // the host's.
  const bool packInt8 = c.int8Across(a.dt, a.op) && !c.int8Feedback;
  for (size_t at = 0; at < a.count; at += chunk) {
    const size_t n = std::min(chunk, a.count - at);
    char* dev = a.buf + at * es;
    const Int8Slot s = packInt8 ? int8SlotOf(c, Blocks::even(n, c.size(), 1).length) : Int8Slot{};
    if (!s.counts.empty()) {
      job.rounds.push_back(int8AllreduceRound(c, dev, s));
      job.slotBytes = std::max(job.slotBytes, int8SlotBytes(s));
      continue;
    }
    // The feedback's residuals are the tensor's: this round's from `at` on.
    Comm chunkComm = c;
    if (c.int8Feedback) chunkComm.int8Feedback = c.int8Feedback.from(at);
    job.rounds.push_back(
        {{{dev, 0, n * es}},
         [comm = chunkComm, &t, n, wire, dt = a.dt, op = a.op](char* slot) mutable {
           if (wire != Wire::F32) widenInPlace(slot, n, wire);
           allreduceSlot(comm, {.buf = slot, .count = n, .dt = dt, .op = op}, t);
           if (wire != Wire::F32) narrowInPlace(slot, slot, n, wire);
         },
         {{dev, 0, n * es}}});
  }
  return job;
}

StagedRoundsJob reduceScatterRounds(const Comm& c, const BlockReduction& r, const Tuning& t) {
  const size_t es = elementSize(r.dt);
  const size_t blockBytes = r.each * es;
  const size_t total = blockBytes * static_cast<size_t>(c.size());
  const Wire wire = c.resultWire(r.dt);
  // Packed, this rank's block comes back from its place in the packed layout.
  const size_t mine = blockBytes * static_cast<size_t>(c.rank());
  const size_t back = wire == Wire::F32 ? mine : mine / 2;
  StagedRoundsJob job;
  job.slotBytes = total;
  job.dt = r.dt;
  job.wire = wire;
  // With error feedback the host quantizes (float32 staged), as for the allreduce.
  const Int8Slot s = c.int8Across(r.dt, r.op) && !c.int8Feedback
                         ? int8SlotOf(c, std::vector<size_t>(static_cast<size_t>(c.size()), r.each))
                         : Int8Slot{};
  if (!s.counts.empty()) {
    // int8 across nodes: the other ranks' blocks quantized on the device,
    // this rank's as it is; its float32 sum comes back.
    StagedRound round;
    for (int j = 0; j < c.size(); ++j)
      round.out.push_back({const_cast<char*>(r.in) + static_cast<size_t>(j) * blockBytes,
                           s.offsets[j], blockBytes, j != c.rank()});
    round.host = [comm = c, s](char* slot) mutable {
      std::vector<char> own;
      int8AcrossPackedReduceScatter(comm, slot, s, quantizedOf(comm, own));
    };
    round.in.push_back({r.out, s.offsets[c.rank()], blockBytes});
    job.slotBytes = int8SlotBytes(s);
    job.rounds.push_back(std::move(round));
    return job;
  }
  job.rounds.push_back(
      {{{const_cast<char*>(r.in), 0, total}},
       [comm = c, &t, blockBytes, total, mine, back, wire, dt = r.dt, op = r.op](char* slot) mutable {
         if (wire != Wire::F32) widenInPlace(slot, total / 4, wire);
         Blocks blocks = Blocks::equal(comm.size(), blockBytes);
         reduceScatterSlot(comm, {.buf = slot, .dt = dt, .op = op, .blocks = &blocks}, t);
         if (wire != Wire::F32) narrowInPlace(slot + back, slot + mine, blockBytes / 4, wire);
       },
       {{r.out, back, blockBytes}}});
  return job;
}

StagedRoundsJob broadcastRounds(const Comm& c, const StagedBroadcast& b, const Tuning& t) {
  const size_t piece = std::max<size_t>(1, std::min(b.roundBytes, b.bytes));
  const bool root = c.rank() == b.root;
  StagedRoundsJob job;
  job.slotBytes = piece;
  job.slots = slotsFor((b.bytes + piece - 1) / piece);
  for (size_t at = 0; at < b.bytes; at += piece) {
    const size_t n = std::min(piece, b.bytes - at);
    StagedRound round;
    (root ? round.out : round.in).push_back({b.buf + at, 0, n});
    round.host = [comm = c, &t, n, r = b.root](char* slot) mutable {
      broadcast(comm, slot, n, r, t);
    };
    job.rounds.push_back(std::move(round));
  }
  return job;
}

StagedRoundsJob allgatherRounds(const Comm& c, const BlockGather& b, size_t roundBytes,
                                const Tuning& t) {
  const size_t p = static_cast<size_t>(c.size()), each = b.eachBytes;
  const size_t me = static_cast<size_t>(c.rank());
  size_t piece = std::max<size_t>(16, roundBytes / p / 16 * 16);
  piece = std::min(piece, std::max<size_t>(each, 1));
  StagedRoundsJob job;
  job.slotBytes = piece * p;
  job.slots = slotsFor((each + piece - 1) / piece);
  for (size_t at = 0; at < each; at += piece) {
    const size_t n = std::min(piece, each - at);
    StagedRound round;
    round.out.push_back({const_cast<char*>(b.in) + at, me * n, n});
    round.host = [comm = c, &t, n](char* slot) mutable {
      allgather(comm, slot, Blocks::equal(comm.size(), n), t);
    };
    for (size_t q = 0; q < p; ++q)
      if (q != me || b.in != b.out + me * each)  // `in` may be out's own block already
        round.in.push_back({b.out + q * each + at, q * n, n});
    job.rounds.push_back(std::move(round));
  }
  return job;
}

}  // namespace smdccl
