#pragma once
// Ranks as threads of this process on any topology, for the in-process
// algorithm tests: every ordered pair of ranks gets a byte ring in memory
// with the shared-memory link's code. Pairs on different nodes get links
// that do not pack in place, so a 16-bit wire goes through the exchange's
// staging as it does over TCP; the algorithms see the topology's nodes.
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/comm.h"
#include "memory_store.h"
#include "topology/topology.h"
#include "transport/mesh.h"
#include "transport/shm_node.h"

namespace smdccl::testing {

// A link between nodes: the ring of ShmLink, staged like a socket.
class CrossNodeMemoryLink final : public ShmLink {
 public:
  using ShmLink::ShmLink;
  bool inPlace() const override { return false; }  // read and written through send() / recv()
  const char* kind() const override { return "memory"; }
};

class MemoryFabric {
 public:
  explicit MemoryFabric(std::vector<int> nodeSizes, size_t ringBytes = 32 << 10)
      : nodeSizes_(std::move(nodeSizes)), ringBytes_(ringBytes) {
    for (int n : nodeSizes_) size_ += n;
    std::vector<int> ranks(size_);
    for (int r = 0; r < size_; ++r) ranks[r] = r;
    topo_ = topologyFromSpec(nodeSizes_, ranks, true);
  }
  // Any topology, also one whose nodes are not consecutive ranks.
  explicit MemoryFabric(Topology topo, size_t ringBytes = 32 << 10)
      : ringBytes_(ringBytes),
        size_(static_cast<int>(topo.nodeOf.size())),
        topo_(std::move(topo)) {}
  int size() const { return size_; }
  const Topology& topology() const { return topo_; }

  // Runs body(rank, comm) on one thread per rank; comm is the whole group
  // (levels set, wire F32). A rank that throws aborts the others. Returns
  // the first error ("" if none).
  std::string run(const std::function<void(int, Comm&)>& body, int timeoutSec = 30) {
    const int p = size_;
    const size_t pairs = static_cast<size_t>(p) * p;
    std::vector<ShmRingHeader> headers(pairs);
    for (auto& h : headers) {
      h.head.value.store(0);
      h.tail.value.store(0);
    }
    std::vector<char> data(pairs * ringBytes_);
    std::unique_ptr<Doorbell[]> bells(new Doorbell[p]);
    for (int r = 0; r < p; ++r) {
      bells[r].count.store(0);
      bells[r].sleeping.store(0);
    }
    auto ring = [&](int from, int to) { return from * p + to; };
    std::atomic<bool> aborted{false};
    std::mutex mu;
    std::string error;
    MemoryStore store;
    std::vector<std::thread> threads;
    for (int r = 0; r < p; ++r) {
      threads.emplace_back([&, r] {
        try {
          std::vector<std::unique_ptr<Link>> links(p);
          for (int q = 0; q < p; ++q) {
            if (q == r) continue;
            ShmRingHeader* out = &headers[ring(r, q)];
            ShmRingHeader* in = &headers[ring(q, r)];
            char* outData = data.data() + ring(r, q) * ringBytes_;
            char* inData = data.data() + ring(q, r) * ringBytes_;
            const ShmLink::Rings rings{out, in, outData, inData, &bells[q], ringBytes_};
            if (topo_.sameNode(r, q)) links[q] = std::make_unique<ShmLink>(q, rings);
            else links[q] = std::make_unique<CrossNodeMemoryLink>(q, rings);
          }
          MeshConfig mc;
          mc.rank = r;
          mc.size = p;
          mc.topology = topo_;
          Mesh mesh(store, mc, std::move(links), &bells[r]);
          Hierarchy levels = hierarchyOf(topo_, r);
          OpContext ctx;
          ctx.opName = "in-process algorithm test";
          ctx.rank = r;
          ctx.deadline = Deadline::after(std::chrono::seconds(timeoutSec));
          ctx.cancel = &aborted;
          ExchangeBook book;
          Comm c{mesh, ctx, topo_.ringOrder(), &levels, {}};
          c.book = &book;
          body(r, c);
        } catch (const std::exception& e) {
          std::lock_guard<std::mutex> lock(mu);
          if (error.empty()) error = "rank " + std::to_string(r) + ": " + e.what();
          aborted = true;
          for (int q = 0; q < p; ++q) bells[q].ring();
        }
      });
    }
    for (auto& t : threads) t.join();
    return error;
  }

 private:
  std::vector<int> nodeSizes_;
  size_t ringBytes_;
  int size_ = 0;
  Topology topo_;
};

}  // namespace smdccl::testing
