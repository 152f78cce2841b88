#include "algorithms/staged_collectives.h"

#include <algorithm>

#include "algorithms/collectives.h"

namespace smdccl {

namespace {
// allreduceRounds' chunk in elements, and its slots.
size_t chunkElems(DType dt, size_t chunkBytes) {
  return std::max<size_t>(1, chunkBytes / elementSize(dt));
}
int slotsFor(size_t count, size_t chunk) {
  return static_cast<int>(
      std::min<size_t>((count + chunk - 1) / chunk, static_cast<size_t>(kStagedRoundSlots)));
}
}  // namespace

size_t allreduceRoundsHostBytes(size_t count, DType dt, size_t chunkBytes) {
  const size_t chunk = chunkElems(dt, chunkBytes);
  return static_cast<size_t>(slotsFor(count, chunk)) * chunk * elementSize(dt);
}

StagedRoundsJob allreduceRounds(const Comm& c, const CollectiveArgs& a, size_t chunkBytes,
                                const Tuning& t) {
  const size_t es = elementSize(a.dt);
  const size_t chunk = chunkElems(a.dt, chunkBytes);
  StagedRoundsJob job;
  job.slotBytes = chunk * es;
  job.slots = slotsFor(a.count, chunk);
  for (size_t at = 0; at < a.count; at += chunk) {
    const size_t n = std::min(chunk, a.count - at);
    char* dev = a.buf + at * es;
    job.rounds.push_back({{{dev, 0, n * es}},
                          [comm = c, &t, n, dt = a.dt, op = a.op](char* slot) mutable {
                            allreduce(comm, {.buf = slot, .count = n, .dt = dt, .op = op}, t);
                          },
                          {{dev, 0, n * es}}});
  }
  return job;
}

StagedRoundsJob reduceScatterRounds(const Comm& c, const BlockReduction& r, const Tuning& t) {
  const size_t blockBytes = r.each * elementSize(r.dt);
  const size_t total = blockBytes * static_cast<size_t>(c.size());
  StagedRoundsJob job;
  job.slotBytes = total;
  job.rounds.push_back({{{const_cast<char*>(r.in), 0, total}},
                        [comm = c, &t, blockBytes, dt = r.dt, op = r.op](char* slot) mutable {
                          Blocks blocks = Blocks::equal(comm.size(), blockBytes);
                          reduceScatter(comm, {.buf = slot, .dt = dt, .op = op, .blocks = &blocks},
                                        t);
                        },
                        {{r.out, blockBytes * static_cast<size_t>(c.rank()), blockBytes}}});
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
  const size_t rounds = (each + piece - 1) / piece;
  job.slots = static_cast<int>(std::min<size_t>(std::max<size_t>(rounds, 1), kStagedRoundSlots));
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
