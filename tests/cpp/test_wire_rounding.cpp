// Float32 reductions on a Comm with a 16-bit wire round their results to the
// wire only where some hop of the Comm is compressed. On one node with
// wireIntra off no hop is: every schedule must give the bits of the same
// schedule on an uncompressed Comm. With wireIntra on every hop is: the
// ranks must end with identical bits, at the wire's precision. Ranks are
// threads of this process on one node (shared memory only; the TCP listener
// is per process, so a Comm spanning nodes only runs its helper here).
#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/comm.h"
#include "check.h"
#include "kernels/cpu/reduce.h"
#include "memory_store.h"
#include "topology/topology.h"
#include "transport/mesh.h"

using namespace smdccl;

namespace {

Deadline soon() { return Deadline::after(std::chrono::seconds(60)); }

// Runs body(rank, comm) on one thread per rank of a group on nodes of
// `nodeSizes` ranks; comm is the whole group, wire F32. Returns the first
// error a rank raised ("" if none).
std::string withGroup(const std::vector<int>& nodeSizes,
                      const std::function<void(int, Comm&)>& body) {
  std::mutex mu;
  std::string error;
  int size = 0;
  for (int n : nodeSizes) size += n;
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  Topology topo = topologyFromSpec(nodeSizes, ranks, true);
  MemoryStore store;
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Mesh> mesh;  // outlives the barrier below
      try {
        MeshConfig mc;
        mc.rank = r;
        mc.size = size;
        mc.topology = topo;
        mc.masterAddr = "127.0.0.1";
        mc.shmRingBytes = 256 << 10;
        mesh = std::make_unique<Mesh>(store, mc, soon());
        Hierarchy levels = hierarchyOf(topo, r);
        OpContext ctx;
        ctx.opName = "wire rounding test";
        ctx.rank = r;
        ctx.deadline = soon();
        ExchangeBook book;
        Comm c{*mesh, ctx, topo.ringOrder(), &levels, {}};
        c.book = &book;
        body(r, c);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
      }
      // Nobody tears its shared memory down while a peer may still read it.
      store.add("done", 1);
      Deadline d = soon();
      while (store.add("done", 0) < size && !d.expired()) std::this_thread::yield();
    });
  }
  for (auto& t : threads) t.join();
  return error;
}

// Values of rank r that 16 bits cannot hold (so rounding shows).
std::vector<float> inputOf(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] =
        static_cast<float>(static_cast<int64_t>((i * 2654435761u + r * 40503u) % 20001) - 10000) /
        37.0f;
  return v;
}

bool sameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// One way of reducing over a Comm; `out` is what this rank holds after it
// that every rank must agree on (the whole buffer, or its own block).
struct Schedule {
  std::string name;
  std::function<std::vector<float>(Comm&, std::vector<float>)> run;
  bool everyRankHoldsIt;  // allreduce: the ranks' results must be identical
};

std::vector<Schedule> schedules(size_t n) {
  std::vector<Schedule> s;
  auto tuned = [](const char* algo) {
    Tuning t;
    t.pipelineChunkBytes = 64 << 10;  // several chunks where a schedule pipelines
    t.force(algo);
    return t;
  };
  for (const char* algo : {"auto", "ring", "rd", "two_level", "two_level_rd"}) {
    Tuning t = tuned(algo);
    s.push_back({std::string("allreduce ") + algo + " n=" + std::to_string(n),
                 [t, n](Comm& c, std::vector<float> v) {
                   allreduce(c,
                             {.buf = reinterpret_cast<char*>(v.data()),
                              .count = n,
                              .dt = DType::F32,
                              .op = RedOp::Sum},
                             t);
                   return v;
                 },
                 true});
    s.push_back({std::string("reduce_scatter ") + algo + " n=" + std::to_string(n),
                 [t, n](Comm& c, std::vector<float> v) {
                   Blocks b = Blocks::even(n, c.size(), sizeof(float));
                   reduceScatter(c,
                                 {.buf = reinterpret_cast<char*>(v.data()),
                                  .dt = DType::F32,
                                  .op = RedOp::Sum,
                                  .blocks = &b},
                                 t);
                   return std::vector<float>(
                       v.begin() + b.offset[c.rank()] / sizeof(float),
                       v.begin() + (b.offset[c.rank()] + b.length[c.rank()]) / sizeof(float));
                 },
                 false});
  }
  // The building blocks themselves, whatever the selection would pick.
  s.push_back({"ringAllreduce n=" + std::to_string(n),
               [n](Comm& c, std::vector<float> v) {
                 ringAllreduce(c, reinterpret_cast<char*>(v.data()), n, DType::F32, RedOp::Sum);
                 return v;
               },
               true});
  s.push_back({"recursiveDoublingAllreduce n=" + std::to_string(n),
               [n](Comm& c, std::vector<float> v) {
                 recursiveDoublingAllreduce(c, reinterpret_cast<char*>(v.data()), n, DType::F32,
                                            RedOp::Sum);
                 return v;
               },
               true});
  s.push_back({"twoLevelAllreduce n=" + std::to_string(n),  // one node: its local ring is final
               [n](Comm& c, std::vector<float> v) {
                 twoLevelAllreduce(c,
                                   {.buf = reinterpret_cast<char*>(v.data()),
                                    .count = n,
                                    .dt = DType::F32,
                                    .op = RedOp::Sum},
                                   {.chunkBytes = 64 << 10});
                 return v;
               },
               true});
  s.push_back({"twoLevelRdAllreduce n=" + std::to_string(n),
               [n](Comm& c, std::vector<float> v) {
                 twoLevelRdAllreduce(c, reinterpret_cast<char*>(v.data()), n, DType::F32,
                                     RedOp::Sum);
                 return v;
               },
               true});
  return s;
}

// Runs every schedule on `ranks` threads (one node) with the plain wire and
// with `wire` (wireIntra as given); results[k][r]: schedule k, rank r.
struct Outcome {
  std::vector<Schedule> scheds;
  std::vector<std::vector<std::vector<float>>> plain, compressed;
  std::string error;
};

Outcome runOneNode(int ranks, size_t n, Wire wire, bool intra) {
  Outcome o;
  o.scheds = schedules(n);
  o.plain.assign(o.scheds.size(), std::vector<std::vector<float>>(ranks));
  o.compressed = o.plain;
  o.error = withGroup({ranks}, [&](int r, Comm& c) {
    for (size_t k = 0; k < o.scheds.size(); ++k) {
      c.wire = Wire::F32;
      c.wireIntra = false;
      o.plain[k][r] = o.scheds[k].run(c, inputOf(r, n));
      c.wire = wire;
      c.wireIntra = intra;
      o.compressed[k][r] = o.scheds[k].run(c, inputOf(r, n));
    }
  });
  return o;
}

}  // namespace

TEST(wire_compressed_hops_are_decided_from_the_topology) {
  // 2 nodes x 2 ranks: the whole group and one rank per node cross nodes,
  // a node's own ranks do not (unless wireIntra).
  std::atomic<int> wrong{0};
  auto expect = [&](bool ok) { wrong += ok ? 0 : 1; };  // CHECK is for the main thread
  std::string error = withGroup({2, 2}, [&](int r, Comm& c) {
    c.wire = Wire::F16;
    const Hierarchy& h = *c.levels;
    Comm local = c.sub(h.nodes[h.myNode]);
    Comm across = c.sub(h.acrossNodes(h.myLocal));
    expect(c.compressesSomeHop(DType::F32) && c.resultWire(DType::F32) == Wire::F16);
    expect(across.compressesSomeHop(DType::F32));
    expect(!local.compressesSomeHop(DType::F32) && local.resultWire(DType::F32) == Wire::F32);
    expect(!c.compressesSomeHop(DType::F64) && c.resultWire(DType::I32) == Wire::F32);
    local.wireIntra = true;
    expect(local.compressesSomeHop(DType::F32) && local.resultWire(DType::F32) == Wire::F16);
    Comm alone = c.sub({r});
    alone.wireIntra = true;
    expect(!alone.compressesSomeHop(DType::F32));  // no hop at all
    c.wire = Wire::F32;
    c.wireIntra = true;
    expect(!c.compressesSomeHop(DType::F32));
  });
  CHECK(error.empty());
  CHECK(wrong == 0);
}

TEST(wire_one_node_without_compress_intra_rounds_nothing) {
  for (int ranks : {2, 4})
    for (Wire wire : {Wire::F16, Wire::BF16})
      for (size_t n : {size_t{7}, size_t{1001}, size_t{100003}}) {
        Outcome o = runOneNode(ranks, n, wire, /*intra=*/false);
        if (!o.error.empty()) std::fprintf(stderr, "  %s\n", o.error.c_str());
        CHECK(o.error.empty());
        for (size_t k = 0; k < o.scheds.size(); ++k)
          for (int r = 0; r < ranks; ++r)
            if (!sameBits(o.compressed[k][r], o.plain[k][r])) {
              std::fprintf(stderr, "  %d ranks, %s wire, %s, rank %d: not the float32 bits\n",
                           ranks, wireName(wire), o.scheds[k].name.c_str(), r);
              CHECK(false);
            }
      }
}

TEST(wire_one_node_with_compress_intra_rounds_alike_on_every_rank) {
  for (int ranks : {2, 4})
    for (Wire wire : {Wire::F16, Wire::BF16})
      for (size_t n : {size_t{7}, size_t{100003}}) {
        Outcome o = runOneNode(ranks, n, wire, /*intra=*/true);
        if (!o.error.empty()) std::fprintf(stderr, "  %s\n", o.error.c_str());
        CHECK(o.error.empty());
        for (size_t k = 0; k < o.scheds.size(); ++k) {
          const Schedule& s = o.scheds[k];
          bool rounded = false;
          for (int r = 0; r < ranks; ++r) {
            std::vector<float> v = o.compressed[k][r];
            if (!sameBits(v, o.plain[k][r])) rounded = true;
            if (s.everyRankHoldsIt && !sameBits(v, o.compressed[k][0])) {
              std::fprintf(stderr, "  %d ranks, %s wire, %s: rank %d differs from rank 0\n", ranks,
                           wireName(wire), s.name.c_str(), r);
              CHECK(false);
            }
            std::vector<float> onWire = v;
            roundToWire(onWire.data(), onWire.size(), wire);
            if (!sameBits(onWire, v)) {
              std::fprintf(stderr,
                           "  %d ranks, %s wire, %s, rank %d: a result is not at the "
                           "wire's precision\n",
                           ranks, wireName(wire), s.name.c_str(), r);
              CHECK(false);
            }
          }
          if (!rounded) {
            std::fprintf(stderr, "  %d ranks, %s wire, %s: nothing was rounded\n", ranks,
                         wireName(wire), s.name.c_str());
            CHECK(false);
          }
        }
      }
}
