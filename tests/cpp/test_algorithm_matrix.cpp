// Every registered algorithm, forced, on every collective it serves, with
// ranks as threads (tests/cpp/memory_fabric.h): flat groups of 1-9, 12 and
// 16 ranks, uniform nodes, uneven nodes and one rank per node; sizes 0, 1,
// primes, pipeline-chunk boundaries and a few MiB; integer, float and
// 16-bit dtypes under their ops; float32 over a 16-bit wire; reduce-scatter
// in place and out of place (input left as it was). Integer-valued
// data makes every result exact whatever the order of the sums, so results
// are compared for equality with a reference folded with the same kernels;
// the wire cases are checked against a float64 reference within the
// per-hop rounding bound, and allreduce results for identical bits on
// every rank.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives.h"
#include "check.h"
#include "common/hash.h"
#include "kernels/cpu/reduce.h"
#include "memory_fabric.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

namespace {

struct Kind {
  DType dt;
  RedOp op;
};

// Encodes an integer-valued number as dt.
void put(char* at, DType dt, double v) {
  switch (dt) {
    case DType::F32: {
      float f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
      break;
    }
    case DType::F64: std::memcpy(at, &v, 8); break;
    case DType::F16:
    case DType::BF16: {
      float f = static_cast<float>(v);
      uint16_t h;
      packToWire(&h, &f, 1, dt == DType::F16 ? Wire::F16 : Wire::BF16);
      std::memcpy(at, &h, 2);
      break;
    }
    case DType::I32: {
      int32_t i = static_cast<int32_t>(v);
      std::memcpy(at, &i, 4);
      break;
    }
    case DType::I64: {
      int64_t i = static_cast<int64_t>(v);
      std::memcpy(at, &i, 8);
      break;
    }
    case DType::I8: {
      int8_t i = static_cast<int8_t>(v);
      std::memcpy(at, &i, 1);
      break;
    }
    default: {
      uint8_t u = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      std::memcpy(at, &u, 1);
    }
  }
}

// Rank r's input for a case: small integers whose reduction is exact in
// every dtype (|sum| <= 3*16; products of +-1 and at most one 2).
std::vector<char> inputOf(int r, size_t n, Kind k, int seed) {
  size_t es = elementSize(k.dt);
  std::vector<char> v(n * es);
  for (size_t i = 0; i < n; ++i) {
    uint64_t h =
        i * 2654435761u + static_cast<uint64_t>(r) * 40503u + static_cast<uint64_t>(seed) * 97u;
    double x;
    if (k.op == RedOp::Prod)
      x = (i % 17 == static_cast<size_t>(r)) ? 2 : ((i + r) % 3 == 0 ? -1 : 1);
    else if (isBitwise(k.op)) x = static_cast<double>((h >> 3) & 0x7f);
    else x = static_cast<double>(h % 7) - 3;
    put(v.data() + i * es, k.dt, x);
  }
  return v;
}

std::vector<char> referenceOf(int p, size_t n, Kind k, int seed) {
  std::vector<char> acc = inputOf(0, n, k, seed);
  for (int r = 1; r < p; ++r) {
    std::vector<char> x = inputOf(r, n, k, seed);
    reduceInto(acc.data(), x.data(), n, k.dt, k.op);
  }
  return acc;
}

// Reports the first mismatches of a run (threads: no CHECK off the main thread).
struct Failures {
  std::atomic<int> count{0};
  std::mutex mu;
  std::vector<std::string> first;
  void add(const std::string& what) {
    if (count++ < 8) {
      std::lock_guard<std::mutex> lock(mu);
      first.push_back(what);
    }
  }
};

std::string shapeName(const std::vector<int>& nodes) {
  std::string s;
  for (int n : nodes) s += (s.empty() ? "" : "+") + std::to_string(n);
  return s;
}

bool sameBytes(const char* a, const char* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// The cases one rank runs, in the same order on every rank.
struct Matrix {
  std::vector<int> nodes;
  std::vector<size_t> sizes;
  std::vector<Kind> kinds;
  bool big;  // add a few-MiB float32 sum per algorithm
};

void runMatrix(const Matrix& m, Failures& fail, std::atomic<int>& cases) {
  MemoryFabric fabric(m.nodes);
  const int p = fabric.size();
  const std::string shape = shapeName(m.nodes);
  std::string error = fabric.run([&](int r, Comm& c) {
    Situation s = situationOf(c, DType::F32, Tuning{});
    for (const Algorithm* algo : registeredAlgorithms()) {
      for (int ci = 0; ci < kCollectives; ++ci) {
        Collective coll = static_cast<Collective>(ci);
        if (!algo->serves(coll) || !algo->canRun(coll, s)) continue;
        Tuning t;
        t.pipelineChunkBytes = 16 << 10;  // several pipeline chunks at 16411 elements
        t.forced[ci] = algo;
        std::vector<size_t> sizes = m.sizes;
        if (m.big) sizes.push_back((3 << 20) / 4 + 5);
        int seed = 0;
        for (size_t n : sizes) {
          for (const Kind& k : m.kinds) {
            if (n > (1 << 20) / 4 && (k.dt != DType::F32 || k.op != RedOp::Sum)) continue;
            ++seed;
            std::string what = shape + " " + algo->name() + " " + collectiveName(coll) + " " +
                               dtypeName(k.dt) + " " + redOpName(k.op) + " n=" + std::to_string(n);
            size_t es = elementSize(k.dt);
            std::vector<char> ref = referenceOf(p, n, k, seed);
            std::vector<char> buf = inputOf(r, n, k, seed);
            bool ok = true;
            switch (coll) {
              case Collective::Allreduce:
                allreduce(c, {.buf = buf.data(), .count = n, .dt = k.dt, .op = k.op}, t);
                ok = sameBytes(buf.data(), ref.data(), n * es);
                break;
              case Collective::Reduce: {
                int root = seed % p;
                reduce(c, {.buf = buf.data(), .count = n, .dt = k.dt, .op = k.op, .root = root}, t);
                ok = r != root || sameBytes(buf.data(), ref.data(), n * es);
                break;
              }
              case Collective::ReduceScatter: {
                // Even blocks, or uneven ones with empty blocks among them.
                Blocks b = Blocks::even(n, p, es);
                if (seed % 2) {
                  std::vector<size_t> len(p);
                  size_t left = n;
                  for (int q = 0; q < p; ++q) {
                    len[q] = q == p - 1 ? left : std::min(left, (n / p) * (q % 3));
                    left -= len[q];
                    len[q] *= es;
                  }
                  b = Blocks::fromLengths(len);
                }
                // Out of place first: from a separate input (odd seeds: the
                // result into the input's own block), which must be left as
                // it was; the scratch starts as garbage.
                std::vector<char> scratch(buf.size(), static_cast<char>(0x6b));
                std::vector<char> in = buf, out(b.length[r] + 1, static_cast<char>(0x3c));
                char* into = seed % 2 ? in.data() + b.offset[r] : out.data();
                reduceScatter(c,
                              {.buf = scratch.data(),
                               .dt = k.dt,
                               .op = k.op,
                               .blocks = &b,
                               .in = in.data(),
                               .out = into},
                              t);
                ok = sameBytes(into, ref.data() + b.offset[r], b.length[r]) &&
                     out.back() == static_cast<char>(0x3c);
                if (seed % 2 && b.length[r])  // an empty block may lie in an empty buffer
                  std::memcpy(in.data() + b.offset[r], buf.data() + b.offset[r], b.length[r]);
                ok = ok && in == buf;
                if (!ok) fail.add("rank " + std::to_string(r) + ": " + what + " out of place");
                // The input in the working buffer itself, the result apart
                // (the backend's form when it had to copy the input anyway).
                std::vector<char> work = buf;
                std::fill(out.begin(), out.end(), static_cast<char>(0x3c));
                reduceScatter(c,
                              {.buf = work.data(),
                               .dt = k.dt,
                               .op = k.op,
                               .blocks = &b,
                               .in = work.data(),
                               .out = out.data()},
                              t);
                if (!sameBytes(out.data(), ref.data() + b.offset[r], b.length[r]) ||
                    out.back() != static_cast<char>(0x3c))
                  fail.add("rank " + std::to_string(r) + ": " + what + " from its own buffer");
                reduceScatter(c, {.buf = buf.data(), .dt = k.dt, .op = k.op, .blocks = &b}, t);
                ok = sameBytes(buf.data() + b.offset[r], ref.data() + b.offset[r], b.length[r]);
                break;
              }
              case Collective::Allgather: {
                Blocks b = Blocks::even(n, p, es);
                std::vector<char> mine(buf.size(), static_cast<char>(0xab));
                if (b.length[r])  // an empty buffer's data() may be null
                  std::memcpy(mine.data() + b.offset[r], buf.data() + b.offset[r], b.length[r]);
                allgather(c, mine.data(), b, t);
                for (int q = 0; q < p && ok; ++q) {
                  std::vector<char> theirs = inputOf(q, n, k, seed);
                  ok = sameBytes(mine.data() + b.offset[q], theirs.data() + b.offset[q],
                                 b.length[q]);
                }
                break;
              }
              case Collective::Broadcast: {
                int root = (seed * 5) % p;
                std::vector<char> want = inputOf(root, n, k, seed);
                if (r != root) std::fill(buf.begin(), buf.end(), static_cast<char>(0x5a));
                broadcast(c, buf.data(), buf.size(), root, t);
                ok = sameBytes(buf.data(), want.data(), want.size());
                break;
              }
            }
            if (!ok) fail.add("rank " + std::to_string(r) + ": " + what);
            if (r == 0) ++cases;
          }
        }
      }
    }
  });
  if (!error.empty()) fail.add(shape + ": " + error);
}

// Float32 sums of random values over a 16-bit wire: within the per-hop
// bound of float64, and (allreduce) the same bits on every rank.
void runWireMatrix(const std::vector<int>& nodes, Wire wire, bool intra, Failures& fail,
                   std::atomic<int>& cases) {
  MemoryFabric fabric(nodes);
  const int p = fabric.size();
  const size_t sizes[] = {1, 1021, 16411};
  auto valueOf = [](int r, size_t i) {
    uint64_t h =
        (i + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(r) + 7) * 0xc2b2ae3d27d4eb4full;
    return static_cast<float>(static_cast<int64_t>(h >> 40) % 20001 - 10000) / 997.0f;
  };
  struct Result {
    std::string what;
    std::vector<uint64_t> hashByRank;
  };
  std::vector<Result> results;
  std::mutex mu;
  std::string error = fabric.run([&](int r, Comm& c) {
    c.wire = wire;
    c.wireIntra = intra;
    Situation s = situationOf(c, DType::F32, Tuning{});
    size_t index = 0;
    for (const Algorithm* algo : registeredAlgorithms()) {
      for (Collective coll :
           {Collective::Allreduce, Collective::ReduceScatter, Collective::Reduce}) {
        if (!algo->serves(coll) || !algo->canRun(coll, s)) continue;
        Tuning t;
        t.pipelineChunkBytes = 16 << 10;
        t.forced[static_cast<int>(coll)] = algo;
        for (size_t n : sizes) {
          std::vector<float> buf(n);
          std::vector<double> exact(n, 0.0), mag(n, 0.0);
          for (size_t i = 0; i < n; ++i) {
            buf[i] = valueOf(r, i);
            for (int q = 0; q < p; ++q) {
              exact[i] += valueOf(q, i);
              mag[i] += std::fabs(valueOf(q, i));
            }
          }
          Blocks b = Blocks::even(n, p, 4);
          int root = static_cast<int>(n % p);
          char* at = reinterpret_cast<char*>(buf.data());
          // The reduce-scatter of 1021 elements runs out of place, the
          // result written over the input's own block.
          const bool outOfPlace = coll == Collective::ReduceScatter && n == 1021;
          std::vector<float> scratch(outOfPlace ? n : 0, -1.0f);
          if (coll == Collective::Allreduce)
            allreduce(c, {.buf = at, .count = n, .dt = DType::F32, .op = RedOp::Sum}, t);
          else if (outOfPlace)
            reduceScatter(c,
                          {.buf = reinterpret_cast<char*>(scratch.data()),
                           .dt = DType::F32,
                           .op = RedOp::Sum,
                           .blocks = &b,
                           .in = at,
                           .out = at + b.offset[r]},
                          t);
          else if (coll == Collective::ReduceScatter)
            reduceScatter(c, {.buf = at, .dt = DType::F32, .op = RedOp::Sum, .blocks = &b}, t);
          else
            reduce(c, {.buf = at, .count = n, .dt = DType::F32, .op = RedOp::Sum, .root = root}, t);
          size_t lo = 0, hi = n;
          if (coll == Collective::ReduceScatter) {
            lo = b.offset[r] / 4;
            hi = lo + b.length[r] / 4;
          }
          if (coll == Collective::Reduce && r != root) hi = lo;
          double u = wire == Wire::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
          std::string what = shapeName(nodes) + " " + wireName(wire) + (intra ? " intra" : "") +
                             " " + algo->name() + " " + collectiveName(coll) +
                             " n=" + std::to_string(n) + (outOfPlace ? " out of place" : "");
          if (outOfPlace)  // the other blocks: still this rank's input
            for (size_t i = 0; i < n; ++i)
              if ((i < b.offset[r] / 4 || i >= (b.offset[r] + b.length[r]) / 4) &&
                  buf[i] != valueOf(r, i)) {
                fail.add("rank " + std::to_string(r) + ": " + what + ": input changed at " +
                         std::to_string(i));
                break;
              }
          for (size_t i = lo; i < hi; ++i) {
            // Each hop rounds a partial sum no larger than sum |x|; at most
            // p + 2 roundings on any path (folds and the final one included).
            double bound = (p + 2) * u * mag[i] + 1e-6;
            if (!(std::fabs(buf[i] - exact[i]) <= bound)) {
              fail.add("rank " + std::to_string(r) + ": " + what + " element " + std::to_string(i) +
                       ": " + std::to_string(buf[i]) + " vs " + std::to_string(exact[i]));
              break;
            }
          }
          {
            std::lock_guard<std::mutex> lock(mu);
            if (results.size() <= index) results.push_back({what, std::vector<uint64_t>(p)});
            Fnv1a h;
            if (coll == Collective::Allreduce)
              for (float f : buf) {
                uint32_t bits;
                std::memcpy(&bits, &f, 4);
                h.mix(bits);
              }
            results[index].hashByRank[r] = h.value;
          }
          ++index;
          if (r == 0) ++cases;
        }
      }
    }
  });
  if (!error.empty()) fail.add(shapeName(nodes) + " wire: " + error);
  for (const Result& res : results)
    for (int q = 1; q < p; ++q)
      if (res.hashByRank[q] != res.hashByRank[0]) {
        fail.add(res.what + ": rank " + std::to_string(q) + "'s bits differ from rank 0's");
        break;
      }
}

void report(Failures& fail, int cases, const char* what) {
  std::fprintf(stderr, "  %s: %d cases\n", what, cases);
  for (const auto& f : fail.first) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  CHECK(fail.count == 0);
  CHECK(cases > 0);
}

const std::vector<Kind> kAllKinds = {{DType::F32, RedOp::Sum}, {DType::F64, RedOp::Max},
                                     {DType::I32, RedOp::Sum}, {DType::I64, RedOp::Prod},
                                     {DType::U8, RedOp::BXor}, {DType::BF16, RedOp::Sum},
                                     {DType::F16, RedOp::Min}, {DType::I8, RedOp::BAnd}};
const std::vector<Kind> kFewKinds = {
    {DType::F32, RedOp::Sum}, {DType::I64, RedOp::Prod}, {DType::BF16, RedOp::Sum}};

}  // namespace

TEST(algorithm_matrix_flat_groups) {
  Failures fail;
  std::atomic<int> cases{0};
  for (int p : {1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16})
    runMatrix({{p}, {0, 1, 7, 1021, 16411}, p <= 5 ? kAllKinds : kFewKinds, p == 4 || p == 7}, fail,
              cases);
  report(fail, cases, "flat groups");
}

TEST(algorithm_matrix_several_nodes) {
  Failures fail;
  std::atomic<int> cases{0};
  const std::vector<std::vector<int>> shapes = {{2, 2},
                                                {3, 3},
                                                {2, 2, 2},
                                                {4, 4},
                                                {2, 2, 2, 2},  // uniform
                                                {3, 1},
                                                {2, 3, 1},
                                                {1, 4, 2},  // uneven
                                                {1, 1, 1},
                                                {1, 1, 1, 1, 1},
                                                {1, 1, 1, 1, 1, 1, 1, 1},
                                                std::vector<int>(12, 1)};  // one per node
  for (const auto& nodes : shapes) {
    bool first = &nodes == &shapes.front();
    runMatrix(
        {nodes, {0, 1, 7, 1021, 16411}, first ? kAllKinds : kFewKinds, first || nodes.size() == 8},
        fail, cases);
  }
  report(fail, cases, "several nodes");
}

TEST(algorithm_matrix_16_bit_wire) {
  Failures fail;
  std::atomic<int> cases{0};
  for (const auto& nodes :
       std::vector<std::vector<int>>{{2, 2}, {2, 3, 1}, {1, 1, 1, 1, 1}, {1, 1, 1, 1}})
    for (Wire w : {Wire::F16, Wire::BF16}) runWireMatrix(nodes, w, false, fail, cases);
  runWireMatrix({4}, Wire::F16, true, fail, cases);
  runWireMatrix({16}, Wire::F16, true, fail, cases);
  runWireMatrix({3, 3}, Wire::BF16, true, fail, cases);
  // Eight ranks: halving across four nodes, and across eight.
  runWireMatrix({2, 2, 2, 2}, Wire::F16, false, fail, cases);
  runWireMatrix(std::vector<int>(8, 1), Wire::F16, false, fail, cases);
  report(fail, cases, "16-bit wire");
}

TEST(binary_trees_span_and_complement) {
  for (int p = 1; p <= 70; ++p) {
    for (int t = 0; t < 2; ++t) {
      int roots = 0;
      for (int r = 0; r < p; ++r) {
        TreeLinks l = binaryTreeLinks(r, p, t);
        if (l.parent < 0) ++roots;
        for (int child : {l.child0, l.child1}) {
          if (child < 0) continue;
          CHECK(child >= 0 && child < p && child != r);
          CHECK(binaryTreeLinks(child, p, t).parent == r);
        }
        if (l.parent >= 0) {
          TreeLinks up = binaryTreeLinks(l.parent, p, t);
          CHECK(up.child0 == r || up.child1 == r);
        }
        // Every rank reaches the root within ceil(log2 p) + 1 hops: no cycles.
        int at = r, hops = 0;
        while (binaryTreeLinks(at, p, t).parent >= 0 && hops <= 40) {
          at = binaryTreeLinks(at, p, t).parent;
          ++hops;
        }
        CHECK(hops <= ceilLog2(p) + 1);
      }
      CHECK(roots == 1);
    }
    // A rank interior in tree 0 is a leaf in tree 1 (odd p: rank 0 is in both).
    int both = 0;
    for (int r = 0; r < p; ++r) {
      TreeLinks a = binaryTreeLinks(r, p, 0), b = binaryTreeLinks(r, p, 1);
      if (a.child0 >= 0 && b.child0 >= 0) ++both;
    }
    CHECK(both <= (p % 2 ? 1 : 0));
  }
}

// What each rank sends, counted by the exchange: a true reduce moves about
// the tensor once per rank (an allreduce about twice), the double tree about
// twice the tensor on its busiest rank, the ring 2(p-1)/p of it.
TEST(bytes_per_rank_by_schedule) {
  for (const std::vector<int>& nodes : {std::vector<int>{8}, std::vector<int>{1, 1, 1, 1, 1}}) {
    MemoryFabric fabric(nodes);
    const int p = fabric.size();
    const size_t n = 16411;
    const double b = n * 4.0;
    struct Case {
      const char* algo;
      Collective coll;
      double maxPerRank;  // in units of b
    };
    const std::vector<Case> cases = {
        {"ring", Collective::Allreduce, 2.0 * (p - 1) / p},
        {"tree", Collective::Allreduce, 2.0},
        {"halving", Collective::Allreduce, 3.0 * (p - 1) / p + 1},  // + the fold's whole message
        {"ring", Collective::Reduce, 1.0},
        {"tree", Collective::Reduce, 1.0},
        {"halving", Collective::Reduce, 2.0}};
    std::vector<std::vector<uint64_t>> sent(cases.size(), std::vector<uint64_t>(p, 0));
    std::string error = fabric.run([&](int r, Comm& c) {
      for (size_t i = 0; i < cases.size(); ++i) {
        Tuning t;
        t.pipelineChunkBytes = 16 << 10;
        t.forced[static_cast<int>(cases[i].coll)] = findAlgorithm(cases[i].algo);
        std::vector<float> buf(n, 1.0f);
        uint64_t count = 0;
        c.ctx.sentBytes = &count;
        if (cases[i].coll == Collective::Allreduce)
          allreduce(c,
                    {.buf = reinterpret_cast<char*>(buf.data()),
                     .count = n,
                     .dt = DType::F32,
                     .op = RedOp::Sum},
                    t);
        else
          reduce(c,
                 {.buf = reinterpret_cast<char*>(buf.data()),
                  .count = n,
                  .dt = DType::F32,
                  .op = RedOp::Sum,
                  .root = 0},
                 t);
        c.ctx.sentBytes = nullptr;
        sent[i][r] = count;
      }
    });
    CHECK(error.empty());
    uint64_t reduceMax = 0, allreduceMax = 0;
    for (size_t i = 0; i < cases.size(); ++i) {
      uint64_t most = *std::max_element(sent[i].begin(), sent[i].end());
      uint64_t total = 0;
      for (uint64_t v : sent[i]) total += v;
      std::fprintf(stderr, "  %s %s on %d ranks: max %.2f b per rank, %.2f b in all\n",
                   cases[i].algo, collectiveName(cases[i].coll), p, most / b, total / b);
      CHECK(most <= cases[i].maxPerRank * b + 64 * p);  // + block rounding
      CHECK(total > 0);
      if (cases[i].coll == Collective::Reduce && std::string(cases[i].algo) == "ring")
        reduceMax = most;
      if (cases[i].coll == Collective::Allreduce && std::string(cases[i].algo) == "ring")
        allreduceMax = most;
    }
    CHECK(reduceMax < allreduceMax);
  }
}
