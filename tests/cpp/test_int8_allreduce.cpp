// The int8 wire's allreduce (algorithms/two_level_int8.cpp), ranks as
// threads: results within the bound the format gives (two quantizations
// of each element: each other node's contribution and the sum, each at most
// half a step of its block's scale), the same bits on every rank, and the
// choice: two_level_int8 wherever it can run on an int8 group, full
// precision elsewhere.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "check.h"
#include "common/hash.h"
#include "kernels/cpu/quantize.h"
#include "memory_fabric.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

namespace {

float valueOf(int r, size_t i) {
  uint64_t h = (i + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(r) + 3) * 0xc2b2ae3d27d4eb4full;
  float v = static_cast<float>(static_cast<int64_t>(h >> 40) % 20001 - 10000) / 977.0f;
  return (h & 0xff) == 0 ? v * 50.0f : v;  // a few large values: blocks of unlike scales
}

// The pipeline chunk of the tests: several chunks from 4097 elements.
constexpr size_t kChunkBytes = 16 << 10;

// [begin, end) of the quantization block holding element i: the layout of
// two_level_int8 (pipeline chunks, each cut into shards over the L local
// ranks, each shard into pieces over the n nodes, blocks from each piece's
// start).
std::pair<size_t, size_t> blockOf(size_t i, size_t count, int L, int n) {
  Blocks chunks = Blocks::even(count, static_cast<int>(pipelineChunks(count * 4, kChunkBytes)), 1);
  int k = 0;
  while (i >= chunks.offset[k] + chunks.length[k]) ++k;
  Blocks shards = Blocks::even(chunks.length[k], L, 1);
  int l = 0;
  while (i - chunks.offset[k] >= shards.offset[l] + shards.length[l]) ++l;
  Blocks pieces = Blocks::even(shards.length[l], n, 1);
  int j = 0;
  while (i - chunks.offset[k] - shards.offset[l] >= pieces.offset[j] + pieces.length[j]) ++j;
  size_t start = chunks.offset[k] + shards.offset[l] + pieces.offset[j], end = start + pieces.length[j];
  size_t b = start + (i - start) / kInt8Block * kInt8Block;
  return {b, std::min(end, b + kInt8Block)};
}

struct Failures {
  std::mutex mu;
  std::vector<std::string> all;
  void add(const std::string& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (all.size() < 8) all.push_back(s);
  }
};

// Rank r's result bits for case `index` (of p ranks), to compare across ranks.
void record(std::vector<std::vector<uint64_t>>& hashes, size_t index, int p, int r,
            const std::vector<float>& buf) {
  Fnv1a h;
  for (float f : buf) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    h.mix(bits);
  }
  if (hashes.size() <= index) hashes.emplace_back(p);
  hashes[index][r] = h.value;
}

// The float32 SUM allreduce of buf in place.
void sumAllreduce(Comm& c, std::vector<float>& buf, const Tuning& t) {
  allreduce(c,
            {.buf = reinterpret_cast<char*>(buf.data()),
             .count = buf.size(),
             .dt = DType::F32,
             .op = RedOp::Sum},
            t);
}

void runShape(const std::vector<int>& nodes, Failures& fail, int& cases) {
  MemoryFabric fabric(nodes);
  const int p = fabric.size(), n = static_cast<int>(nodes.size()), L = nodes[0];
  // Several nodes of one size: the int8 wire; otherwise full precision.
  const bool uniform =
      n > 1 && std::all_of(nodes.begin(), nodes.end(), [&](int k) { return k == L; });
  std::string shape;
  for (int k : nodes) shape += (shape.empty() ? "" : "+") + std::to_string(k);
  std::vector<std::vector<uint64_t>> hashes;
  std::mutex mu;
  const size_t sizes[] = {0, 1, 7, 1000, 65537};
  std::string error = fabric.run([&](int r, Comm& c) {
    c.int8 = true;
    Tuning t;
    t.pipelineChunkBytes = kChunkBytes;
    const Algorithm* chosen = allreduceAlgorithm(c, 1000, DType::F32, t);
    if ((std::string(chosen->name()) == "two_level_int8") != uniform)
      fail.add(shape + ": chose " + chosen->name());
    size_t index = 0;
    for (size_t count : sizes) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = valueOf(r, i);
      sumAllreduce(c, buf, t);
      // Node sums and the total, in float64.
      std::vector<std::vector<double>> node(n, std::vector<double>(count, 0.0));
      std::vector<double> total(count, 0.0);
      for (int q = 0, k = 0; k < n; ++k)
        for (int m = 0; m < nodes[k]; ++m, ++q)
          for (size_t i = 0; i < count; ++i) {
            node[k][i] += valueOf(q, i);
            total[i] += valueOf(q, i);
          }
      size_t rounded = 0;  // elements visibly quantized
      for (size_t i = 0; i < count; ++i) {
        if (std::fabs(buf[i] - total[i]) > 1e-3 * std::fabs(total[i]) + 1e-4) ++rounded;
        double bound = 0.0;
        if (uniform) {
          auto [b, e] = blockOf(i, count, L, n);
          double sumMax = 0.0;
          for (size_t j = b; j < e; ++j) sumMax = std::max(sumMax, std::fabs(total[j]));
          bound = sumMax / 254.0;  // the sum's quantization
          for (int k = 0; k < n; ++k) {  // every node's contribution, the owner's too (loose by one)
            double m = 0.0;
            for (size_t j = b; j < e; ++j) m = std::max(m, std::fabs(node[k][j]));
            bound += m / 254.0;
          }
        }
        bound += 1e-5 * (std::fabs(total[i]) + 1.0);  // float32 sums
        if (!(std::fabs(buf[i] - total[i]) <= bound)) {
          fail.add("rank " + std::to_string(r) + " " + shape + " n=" + std::to_string(count) +
                   " element " + std::to_string(i) + ": " + std::to_string(buf[i]) + " vs " +
                   std::to_string(total[i]) + " (bound " + std::to_string(bound) + ")");
          break;
        }
      }
      if (uniform && count >= 1000 && rounded == 0)
        fail.add(shape + " n=" + std::to_string(count) + ": exact: the int8 wire did not run");
      std::lock_guard<std::mutex> lock(mu);
      record(hashes, index++, p, r, buf);
    }
  });
  if (!error.empty()) fail.add(shape + ": " + error);
  for (size_t k = 0; k < hashes.size(); ++k)
    for (int q = 1; q < p; ++q)
      if (hashes[k][q] != hashes[k][0]) fail.add(shape + ": rank bits differ, size #" + std::to_string(k));
  cases += static_cast<int>(hashes.size());
}

// The float32 SUM reduce-scatter of buf (laid out as b) in place.
void sumScatter(Comm& c, std::vector<float>& buf, const Blocks& b, const Tuning& t) {
  reduceScatter(c,
                {.buf = reinterpret_cast<char*>(buf.data()),
                 .dt = DType::F32,
                 .op = RedOp::Sum,
                 .blocks = &b},
                t);
}

}  // namespace

TEST(int8_allreduce_within_the_format_bound_on_every_rank) {
  Failures fail;
  int cases = 0;
  for (const auto& nodes : std::vector<std::vector<int>>{
           {2, 2}, {3, 3}, {2, 2, 2}, {1, 1, 1}, {4, 4}, {1, 1, 1, 1, 1}, {3, 1}, {4}})
    runShape(nodes, fail, cases);
  for (const auto& f : fail.all) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  CHECK(fail.all.empty());
  CHECK(cases == 8 * 5);
}

// A wrong sum must fail the bound: the check above can fail.
TEST(int8_bound_catches_a_missing_contribution) {
  const size_t count = 1000;
  double worst = 0.0;
  for (size_t i = 0; i < count; ++i) {
    double total = 0.0, missing = 0.0;
    for (int q = 0; q < 4; ++q) total += valueOf(q, i);
    missing = total - valueOf(3, i);
    auto [b, e] = blockOf(i, count, 2, 2);  // (16 KiB chunks: one at 1000 elements)
    double m = 0.0;
    for (size_t j = b; j < e; ++j) m = std::max(m, std::fabs(static_cast<double>(valueOf(3, j))));
    worst = std::max(worst, std::fabs(missing - total) / (m / 254.0 * 3 + 1e-5));
  }
  CHECK(worst > 10.0);
}

// Error feedback: over k steps on the same tensor, what the allreduces
// applied equals the true sum up to one step's quantization error (the
// residuals left at the end), not k steps' worth; without feedback the
// drift passes that bound (so the check can fail).
TEST(int8_error_feedback_keeps_the_running_sum) {
  const std::vector<int> nodes = {2, 2};
  const int steps = 30;
  const size_t count = 20000;
  for (bool feedback : {true, false}) {
    MemoryFabric fabric(nodes);
    std::vector<std::vector<double>> applied(4, std::vector<double>(count, 0.0));
    std::vector<double> truth(count, 0.0), stepBound(count, 0.0);
    std::string error = fabric.run([&](int r, Comm& c) {
      c.int8 = true;
      Int8Residuals residuals;
      residuals.fit(count, true);
      if (feedback) c.int8Feedback = {&residuals};
      Tuning t;
      t.pipelineChunkBytes = kChunkBytes;
      for (int s = 0; s < steps; ++s) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = valueOf(r + 4 * s, i) * 0.01f;
        sumAllreduce(c, buf, t);
        for (size_t i = 0; i < count; ++i) applied[r][i] += buf[i];
      }
    });
    CHECK(error.empty());
    // One step's bound: half a step of every node's block and of the sum's,
    // with the largest values any step had.
    for (int s = 0; s < steps; ++s) {
      std::vector<double> node0(count), node1(count), total(count);
      for (size_t i = 0; i < count; ++i) {
        node0[i] = (valueOf(0 + 4 * s, i) + valueOf(1 + 4 * s, i)) * 0.01;
        node1[i] = (valueOf(2 + 4 * s, i) + valueOf(3 + 4 * s, i)) * 0.01;
        total[i] = node0[i] + node1[i];
        truth[i] += total[i];
      }
      for (size_t i = 0; i < count; ++i) {
        auto [b, e] = blockOf(i, count, 2, 2);
        double m0 = 0, m1 = 0, mt = 0;
        for (size_t j = b; j < e; ++j) {
          m0 = std::max(m0, std::fabs(node0[j]));
          m1 = std::max(m1, std::fabs(node1[j]));
          mt = std::max(mt, std::fabs(total[j]));
        }
        stepBound[i] = std::max(stepBound[i], (m0 + m1 + mt) / 254.0);
      }
    }
    size_t over = 0;
    for (int r = 0; r < 4; ++r)
      for (size_t i = 0; i < count; ++i)
        // Residuals carried into a block raise its scale a little: 5 % slack,
        // and float32 sums over the steps.
        if (std::fabs(applied[r][i] - truth[i]) > 1.05 * stepBound[i] + 1e-4) ++over;
    if (feedback) CHECK(over == 0);
    else CHECK(over > 0);
    std::fprintf(stderr, "  error feedback %s: %zu of %zu elements over one step's bound\n",
                 feedback ? "on" : "off", over, 4 * count);
  }
}

// Error feedback on the int8 reduce-scatter (FSDP2's gradients, keyed by
// module): over k steps each rank's applied block equals the true sum up to
// one step's quantization of the other node's contribution (the largest
// magnitude within 127 values of the element, over the steps), pipelined in
// 1 KiB chunks so the residuals are indexed piece by piece; without
// feedback the drift passes that bound.
TEST(int8_reduce_scatter_error_feedback_keeps_the_running_sum) {
  const int steps = 30;
  const size_t each = 3000;
  for (bool feedback : {true, false}) {
    MemoryFabric fabric({2, 2});
    std::vector<std::vector<double>> applied(4, std::vector<double>(each, 0.0));
    std::string error = fabric.run([&](int r, Comm& c) {
      c.int8 = true;
      Int8Residuals residuals;
      residuals.fit(4 * each, false);
      if (feedback) c.int8Feedback = {&residuals};
      Tuning t;
      t.pipelineChunkBytes = 1 << 10;
      const Blocks b = Blocks::equal(4, each * sizeof(float));
      for (int s = 0; s < steps; ++s) {
        std::vector<float> buf(4 * each);
        for (size_t i = 0; i < buf.size(); ++i) buf[i] = valueOf(r + 4 * s, i) * 0.01f;
        sumScatter(c, buf, b, t);
        for (size_t i = 0; i < each; ++i) applied[r][i] += buf[r * each + i];
      }
    });
    CHECK(error.empty());
    size_t over = 0;
    for (int r = 0; r < 4; ++r) {
      const int other = r < 2 ? 2 : 0;  // the first rank of the other node
      std::vector<double> truth(each, 0.0), most(each, 0.0);
      for (int s = 0; s < steps; ++s)
        for (size_t i = 0; i < each; ++i) {
          const size_t at = r * each + i;
          for (int q = 0; q < 4; ++q) truth[i] += valueOf(q + 4 * s, at) * 0.01;
          for (size_t j = i > 127 ? i - 127 : 0; j < std::min(each, i + 128); ++j) {
            const size_t k = r * each + j;
            const double theirs =
                (valueOf(other + 4 * s, k) + valueOf(other + 1 + 4 * s, k)) * 0.01;
            most[i] = std::max(most[i], std::fabs(theirs));
          }
        }
      // Residuals carried into a block raise its scale a little: 5 % slack.
      for (size_t i = 0; i < each; ++i)
        if (std::fabs(applied[r][i] - truth[i]) > 1.05 * most[i] / 254.0 + 1e-4) ++over;
    }
    if (feedback) CHECK(over == 0);
    else CHECK(over > 0);
    std::fprintf(stderr, "  error feedback %s: %zu of %zu elements over one step's bound\n",
                 feedback ? "on" : "off", over, 4 * each);
  }
}

// The int8 reduce-scatter: each rank's block within one quantization of
// every other node's contribution (half a step of its block scale, taken
// as the largest magnitude within 127 values of the element: a block of
// 128 from the start of a pipeline piece lies in that window), even and
// uneven blocks, in one chunk and pipelined in chunks of 1 KiB (up to as
// many pieces as the smallest block has values).
TEST(int8_reduce_scatter_within_one_quantization) {
  Failures fail;
  int cases = 0;
  for (const auto& nodes : std::vector<std::vector<int>>{{2, 2}, {3, 3}, {2, 2, 2}, {1, 1, 1}}) {
    MemoryFabric fabric(nodes);
    const int p = fabric.size(), n = static_cast<int>(nodes.size()), L = nodes[0];
    for (size_t chunkBytes : {size_t{4} << 20, size_t{1} << 10})
      for (bool uneven : {false, true}) {
        std::vector<size_t> len(p);
        for (int r = 0; r < p; ++r) len[r] = (uneven ? 300 + 517 * r : 1000) * sizeof(float);
        const Blocks b = Blocks::fromLengths(len);
        const size_t count = b.total() / sizeof(float);
        std::string error = fabric.run([&](int r, Comm& c) {
          c.int8 = true;
          Tuning t;
          t.pipelineChunkBytes = chunkBytes;
          if (std::string(reduceScatterAlgorithm(c, b.total(), DType::F32, t)->name()) !=
              "two_level_int8")
            fail.add("reduce-scatter did not choose two_level_int8");
          std::vector<float> buf(count);
          for (size_t i = 0; i < count; ++i) buf[i] = valueOf(r, i);
          sumScatter(c, buf, b, t);
          const size_t first = b.offset[r] / 4, m = b.length[r] / 4;
          size_t rounded = 0;
          for (size_t i = first; i < first + m; ++i) {
            const size_t qb = std::max(first, i + 1 - std::min(i + 1, kInt8Block));
            const size_t qe = std::min(first + m, i + kInt8Block);
            double total = 0.0, bound = 1e-5;
            for (int k = 0; k < n; ++k) {
              double node = 0.0, most = 0.0;
              for (int l = 0; l < L; ++l) node += valueOf(k * L + l, i);
              for (size_t j = qb; j < qe; ++j) {
                double v = 0.0;
                for (int l = 0; l < L; ++l) v += valueOf(k * L + l, j);
                most = std::max(most, std::fabs(v));
              }
              total += node;
              if (k != r / L) bound += most / 254.0;  // the owner's own node is not quantized
            }
            bound += 1e-6 * std::fabs(total);
            if (std::fabs(buf[i] - total) > 1e-3 * std::fabs(total) + 1e-4) ++rounded;
            if (!(std::fabs(buf[i] - total) <= bound)) {
              fail.add("rank " + std::to_string(r) + " element " + std::to_string(i) + ": " +
                       std::to_string(buf[i]) + " vs " + std::to_string(total));
              break;
            }
          }
          if (rounded == 0)
            fail.add("rank " + std::to_string(r) + ": exact: nothing was quantized");
        });
        if (!error.empty()) fail.add(error);
        ++cases;
      }
  }
  for (const auto& f : fail.all) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  CHECK(fail.all.empty());
  CHECK(cases == 16);
}

namespace {

// [begin, end) of element i's quantization block in two_level_int8_halving:
// shards over the L local ranks of the whole tensor, each cut into pieces
// over the n nodes, blocks from each piece's start (the same at every step).
std::pair<size_t, size_t> halvingBlockOf(size_t i, size_t count, int L, int n) {
  Blocks shards = Blocks::even(count, L, 1);
  int l = 0;
  while (i >= shards.offset[l] + shards.length[l]) ++l;
  Blocks pieces = Blocks::even(shards.length[l], n, 1);
  int j = 0;
  while (i - shards.offset[l] >= pieces.offset[j] + pieces.length[j]) ++j;
  const size_t start = shards.offset[l] + pieces.offset[j], end = start + pieces.length[j];
  const size_t b = start + (i - start) / kInt8Block * kInt8Block;
  return {b, std::min(end, b + kInt8Block)};
}

}  // namespace

// two_level_int8_halving (forced): every rank's result within log2(n) + 1
// quantizations (each step's partial sum is bounded by the nodes' sums'
// magnitudes, then the sum's), the same bits on every rank, and visibly
// quantized.
TEST(int8_halving_allreduce_within_its_bound_on_every_rank) {
  Failures fail;
  int cases = 0;
  for (const auto& nodes : std::vector<std::vector<int>>{
           {1, 1, 1, 1}, {2, 2, 2, 2}, {3, 3, 3, 3}, {1, 1, 1, 1, 1, 1, 1, 1}}) {
    MemoryFabric fabric(nodes);
    const int p = fabric.size(), n = static_cast<int>(nodes.size()), L = nodes[0];
    int steps = 0;
    while ((1 << steps) < n) ++steps;
    std::vector<std::vector<uint64_t>> hashes;
    std::mutex mu;
    std::string error = fabric.run([&](int r, Comm& c) {
      c.int8 = true;
      Tuning t;
      t.force("allreduce:two_level_int8_halving");
      size_t index = 0;
      for (size_t count : {size_t{1}, size_t{7}, size_t{1000}, size_t{65537}}) {
        std::vector<float> buf(count);
        for (size_t i = 0; i < count; ++i) buf[i] = valueOf(r, i);
        sumAllreduce(c, buf, t);
        size_t rounded = 0;
        for (size_t i = 0; i < count; ++i) {
          auto [b, e] = halvingBlockOf(i, count, L, n);
          double total = 0.0, nodesMax = 0.0, sumMax = 0.0;
          for (int q = 0; q < p; ++q) total += valueOf(q, i);
          for (int k = 0; k < n; ++k) {
            double m = 0.0;
            for (size_t j = b; j < e; ++j) {
              double v = 0.0;
              for (int l = 0; l < L; ++l) v += valueOf(k * L + l, j);
              m = std::max(m, std::fabs(v));
            }
            nodesMax += m;
          }
          for (size_t j = b; j < e; ++j) {
            double v = 0.0;
            for (int q = 0; q < p; ++q) v += valueOf(q, j);
            sumMax = std::max(sumMax, std::fabs(v));
          }
          const double bound =
              1.01 * (steps * nodesMax + sumMax) / 254.0 + 1e-5 * (std::fabs(total) + 1.0);
          if (std::fabs(buf[i] - total) > 1e-3 * std::fabs(total) + 1e-4) ++rounded;
          if (!(std::fabs(buf[i] - total) <= bound)) {
            fail.add("rank " + std::to_string(r) + " n=" + std::to_string(count) + " element " +
                     std::to_string(i) + ": " + std::to_string(buf[i]) + " vs " +
                     std::to_string(total) + " (bound " + std::to_string(bound) + ")");
            break;
          }
        }
        if (count >= 1000 && rounded == 0) fail.add("exact: the int8 wire did not run");
        std::lock_guard<std::mutex> lock(mu);
        record(hashes, index++, p, r, buf);
      }
    });
    if (!error.empty()) fail.add(error);
    for (size_t k = 0; k < hashes.size(); ++k)
      for (int q = 1; q < p; ++q)
        if (hashes[k][q] != hashes[k][0]) fail.add("rank bits differ, size #" + std::to_string(k));
    cases += static_cast<int>(hashes.size());
  }
  for (const auto& f : fail.all) std::fprintf(stderr, "  FAIL %s\n", f.c_str());
  CHECK(fail.all.empty());
  CHECK(cases == 4 * 4);
}

// The choice between the int8 allreduces: halving for small tensors over
// many nodes (a power of two), where the direct exchange's n - 1 messages
// per phase cost more than log2(n) start-ups; the direct exchange for large
// ones (its pipeline overlaps the node's steps and the network's), on
// fewer nodes, and with error feedback (whose residuals cover its two
// quantizations).
TEST(int8_halving_chosen_for_small_tensors_over_many_nodes) {
  auto pick = [](int nodes, double bytes, bool feedback) {
    Situation s;
    s.g.nodes = nodes;
    s.g.maxLocal = 2;
    s.g.ranks = 2 * nodes;
    s.int8 = true;
    s.int8Feedback = feedback;
    return std::string(
        choose(Collective::Allreduce, static_cast<size_t>(bytes), s, Tuning{}).algo->name());
  };
  CHECK(pick(256, 64 << 10, false) == "two_level_int8_halving");
  CHECK(pick(256, 256 << 20, false) == "two_level_int8");
  CHECK(pick(256, 64 << 10, true) == "two_level_int8");
  CHECK(pick(8, 64 << 10, false) == "two_level_int8");
  CHECK(pick(2, 64 << 10, false) == "two_level_int8");
  CHECK(pick(3, 64 << 10, false) == "two_level_int8");
  // Somewhere between, the choice turns (and stays turned above).
  bool direct = false;
  for (double b = 64 << 10; b <= 256 << 20; b *= 2) {
    const bool d = pick(256, b, false) == "two_level_int8";
    CHECK(d || !direct);
    direct = d;
  }
}

// A step with inf or NaN (a loss scaler's overflow, which it skips) leaves
// no residual: its blocks decode to NaN that step, and every later step is
// finite again. Before, the residual x - NaN made every later step NaN.
TEST(int8_error_feedback_survives_a_non_finite_step) {
  const size_t count = 4096;
  MemoryFabric fabric({2, 2});
  std::string error = fabric.run([&](int r, Comm& c) {
    c.int8 = true;
    Int8Residuals residuals;
    residuals.fit(count, true);
    c.int8Feedback = {&residuals};
    Tuning t;
    t.pipelineChunkBytes = kChunkBytes;
    for (int s = 0; s < 4; ++s) {
      std::vector<float> buf(count);
      for (size_t i = 0; i < count; ++i) buf[i] = valueOf(r + 4 * s, i) * 0.01f;
      if (s == 0 && r == 1) {
        buf[10] = std::numeric_limits<float>::infinity();
        buf[3000] = std::numeric_limits<float>::quiet_NaN();
      }
      sumAllreduce(c, buf, t);
      size_t nonFinite = 0;
      for (float v : buf) nonFinite += std::isfinite(v) ? 0 : 1;
      if (s == 0) CHECK(nonFinite > 0);  // the overflow reaches every rank, as AMP needs
      else CHECK(nonFinite == 0);
    }
  });
  CHECK(error.empty());
}
