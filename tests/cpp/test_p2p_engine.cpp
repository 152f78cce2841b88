// Point-to-point between two "ranks" that are threads of this process, over
// a real Mesh (TCP, one rank per node): a send whose data could not be made
// ready (a CUDA send's copy failed) fails its matching receive with the
// sender's reason, and the next message of the same tag still goes to the
// next receive.
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "memory_store.h"
#include "topology/topology.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

using namespace smdccl;

namespace {

// A completion as a future of its error ("" on success).
struct Outcome {
  std::promise<std::string> promise;
  Completion completion() {
    return [this](std::exception_ptr e) {
      std::string what;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) {
          what = ex.what();
        }
        if (what.empty()) what = "(error without a message)";
      }
      promise.set_value(what);
    };
  }
  std::string get() { return promise.get_future().get(); }
};

}  // namespace

TEST(p2p_failed_send_fails_only_its_matching_recv) {
  MemoryStore store;
  auto deadline = [] { return Deadline::after(std::chrono::seconds(20)); };
  std::vector<std::thread> ranks;
  std::string firstRecv, secondRecv, failedSend, goodSend;
  std::vector<int> got(4, 0);
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      MeshConfig mc;
      mc.rank = r;
      mc.size = 2;
      mc.topology = topologyFromSpec({1, 1}, {0, 1}, true);  // two nodes: TCP
      mc.masterAddr = "127.0.0.1";
      Mesh mesh(store, mc, deadline());
      P2PEngine p2p(mesh, "p2p-test", [] { return std::chrono::milliseconds(20000); });
      if (r == 0) {
        std::vector<int> data = {7, 8, 9, 10};
        Outcome bad, good;
        p2p.send(1, data.data(), data.size() * sizeof(int), 5, deadline(), bad.completion(),
                 [](Deadline) { throw std::runtime_error("the copy to host memory failed"); });
        p2p.send(1, data.data(), data.size() * sizeof(int), 5, deadline(), good.completion());
        failedSend = bad.get();
        goodSend = good.get();
      } else {
        Outcome first, second;
        std::vector<int> lost(4, -1);
        p2p.recv(0, lost.data(), lost.size() * sizeof(int), 5, deadline(), first.completion());
        p2p.recv(0, got.data(), got.size() * sizeof(int), 5, deadline(), second.completion());
        firstRecv = first.get();
        secondRecv = second.get();
        CHECK(lost == std::vector<int>(4, -1));  // left as it was
      }
      storeBarrier(store, "p2p-test-done", 2, deadline());  // both done before either tears down
    });
  }
  for (auto& t : ranks) t.join();
  CHECK(failedSend.find("the copy to host memory failed") != std::string::npos);
  CHECK(goodSend.empty());
  CHECK(firstRecv.find("rank 0 could not send its tensor: the copy to host memory failed") !=
        std::string::npos);
  CHECK(secondRecv.empty());
  CHECK((got == std::vector<int>{7, 8, 9, 10}));
}
