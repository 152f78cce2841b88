// Point-to-point between two ranks in two processes (this test binary runs
// itself again as rank 1), over a real Mesh (TCP, one rank per node) and a
// store in a directory: a send whose data could not be made ready (a CUDA
// send's copy failed) fails its matching receive with the sender's reason,
// and the next message of the same tag still goes to the next receive.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "file_store.h"
#include "topology/topology.h"
#include "transport/mesh.h"
#include "transport/p2p_engine.h"

using namespace smdccl;

namespace {

Deadline soon() { return Deadline::after(std::chrono::seconds(20)); }

// A completion as a future of its error ("" on success).
struct Outcome {
  std::promise<std::string> promise;
  Completion completion() {
    return [this](std::exception_ptr e) {
      std::string what;
      if (e) {
        try {
          std::rethrow_exception(e);
        } catch (const std::exception& ex) { what = ex.what(); }
        if (what.empty()) what = "(error without a message)";
      }
      promise.set_value(what);
    };
  }
  std::string get() { return promise.get_future().get(); }
};

// Rank `rank` of the two: rank 0 sends tag 5 twice (the first one's data
// never gets ready), rank 1 receives tag 5 twice. Each puts what it saw in
// the store under result/<name>.
void p2pRank(int rank, FileStore& store) {
  MeshConfig mc;
  mc.rank = rank;
  mc.size = 2;
  mc.topology = topologyFromSpec({1, 1}, {0, 1}, true);  // two nodes: TCP
  mc.masterAddr = "127.0.0.1";
  Mesh mesh(store, mc, soon());
  P2PEngine p2p(mesh, "p2p-test", [] { return std::chrono::milliseconds(20000); });
  if (rank == 0) {
    std::vector<int> data = {7, 8, 9, 10};
    Outcome bad, good;
    p2p.send(
        1, {.buf = data.data(),
            .bytes = data.size() * sizeof(int),
            .tag = 5,
            .deadline = soon(),
            .done = bad.completion(),
            .ready = []() -> bool { throw std::runtime_error("the copy to host memory failed"); }});
    p2p.send(1, {.buf = data.data(),
                 .bytes = data.size() * sizeof(int),
                 .tag = 5,
                 .deadline = soon(),
                 .done = good.completion()});
    store.set("result/send1", bad.get());
    store.set("result/send2", good.get());
  } else {
    Outcome first, second;
    std::vector<int> lost(4, -1), got(4, 0);
    p2p.recv(0, {.buf = lost.data(),
                 .bytes = lost.size() * sizeof(int),
                 .tag = 5,
                 .deadline = soon(),
                 .done = first.completion()});
    p2p.recv(0, {.buf = got.data(),
                 .bytes = got.size() * sizeof(int),
                 .tag = 5,
                 .deadline = soon(),
                 .done = second.completion()});
    store.set("result/recv1", first.get());
    store.set("result/recv2", second.get());
    store.set("result/lost_untouched", lost == std::vector<int>(4, -1) ? "yes" : "no");
    store.set("result/got", std::to_string(got[0]) + "," + std::to_string(got[1]) + "," +
                                std::to_string(got[2]) + "," + std::to_string(got[3]));
  }
  storeBarrier(store, "p2p-test-done", 2, soon());  // both done before either tears down
}

ChildRegistrar p2pChild("p2p_rank1", [](const std::vector<std::string>& args) {
  FileStore store(args.at(0));
  p2pRank(1, store);
  return 0;
});

}  // namespace

TEST(p2p_failed_send_fails_only_its_matching_recv) {
  char dirTemplate[] = "/tmp/smdccl-p2p-test-XXXXXX";
  std::string dir = mkdtemp(dirTemplate);
  FileStore store(dir);
  pid_t child = fork();
  if (child == 0) {  // a fresh process: exec, not the threads of this one
    execl("/proc/self/exe", "smdccl_core_tests", "--child", "p2p_rank1", dir.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  CHECK(child > 0);
  p2pRank(0, store);
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto result = [&](const char* name) { return store.get(std::string("result/") + name, soon()); };
  std::string send1 = result("send1"), send2 = result("send2"), recv1 = result("recv1"),
              recv2 = result("recv2");
  std::fprintf(stderr, "  send 1: '%s'\n  send 2: '%s'\n  recv 1: '%s'\n  recv 2: '%s'\n",
               send1.c_str(), send2.c_str(), recv1.c_str(), recv2.c_str());
  CHECK(send1.find("the copy to host memory failed") != std::string::npos);
  CHECK(send2.empty());
  CHECK(recv1.find("rank 0 could not send its tensor: the copy to host memory failed") !=
        std::string::npos);
  CHECK(recv2.empty());
  CHECK(result("lost_untouched") == "yes");
  CHECK(result("got") == "7,8,9,10");
  std::system(("rm -rf " + dir).c_str());
}
