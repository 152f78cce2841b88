// Point-to-point between two ranks in two processes (this test binary runs
// itself again as rank 1), over a real Mesh (TCP, one rank per node) and a
// store in a directory: a send whose data could not be made ready (a CUDA
// send's copy failed) fails its matching receive with the sender's reason,
// and the next message of the same tag still goes to the next receive.
// And with three ranks (the test runs itself as rank 2): a peer that hangs
// in the connection handshake holds up no other peer's send.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
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
#include "transport/p2p_loops.h"

using namespace smdccl;

namespace {

Deadline soon() { return Deadline::after(std::chrono::seconds(20)); }

// `body` as rank `rank` of a test, in this binary run again (--child):
// the store is the directory named by its argument.
ChildMain asRank(void (*body)(int, FileStore&), int rank) {
  return [body, rank](const std::vector<std::string>& args) {
    FileStore store(args.at(0));
    body(rank, store);
    return 0;
  };
}

// Starts child `name` over the store in `dir`, in a fresh process (exec,
// not the threads of this one).
pid_t spawnChild(const char* name, const std::string& dir) {
  pid_t child = fork();
  if (child == 0) {
    execl("/proc/self/exe", "smdccl_core_tests", "--child", name, dir.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  CHECK(child > 0);
  return child;
}

void reapChild(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

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

ChildRegistrar p2pChild("p2p_rank1", asRank(p2pRank, 1));

}  // namespace

TEST(p2p_failed_send_fails_only_its_matching_recv) {
  char dirTemplate[] = "/tmp/smdccl-p2p-test-XXXXXX";
  std::string dir = mkdtemp(dirTemplate);
  FileStore store(dir);
  pid_t child = spawnChild("p2p_rank1", dir);
  p2pRank(0, store);
  reapChild(child);
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

// ------------------------------------------------ a peer that hangs in the handshake
//
// Rank 1 of three never runs: its listener address in the store is a
// socket that takes connections (the kernel's backlog) but never answers a
// Hello, as a stopped or swapping process does. Rank 0 sends to rank 1,
// then to rank 2 (another process): the second send completes at once,
// while the first one's dial waits for its deadline and then fails it.

namespace {

constexpr auto kHungDeadline = std::chrono::seconds(4);

double processCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

void hungPeerRank(int rank, FileStore& store) {
  MeshConfig mc;
  mc.rank = rank;
  mc.size = 3;
  mc.topology = topologyFromSpec({1, 1, 1}, {0, 1, 2}, true);  // three nodes: TCP
  mc.masterAddr = "127.0.0.1";
  Mesh mesh(store, mc, soon());
  // SMDCCL_WARN_AFTER=1: a send still being dialled must not count as due
  // for its warning (the sending loop spun on it until the dial ended).
  P2PEngine p2p(mesh, "hung-peer-test", [] { return std::chrono::milliseconds(20000); }, 1.0);
  std::vector<int> data(4, rank + 2);
  if (rank == 0) {
    Outcome toHung, toLive;
    auto start = std::chrono::steady_clock::now();
    const double cpuStart = processCpuSeconds();
    p2p.send(1, {.buf = data.data(),
                 .bytes = data.size() * sizeof(int),
                 .tag = 1,
                 .deadline = Deadline::after(kHungDeadline),
                 .done = toHung.completion()});
    p2p.send(2, {.buf = data.data(),
                 .bytes = data.size() * sizeof(int),
                 .tag = 1,
                 .deadline = soon(),
                 .done = toLive.completion()});
    store.set("result/live", toLive.get());
    double liveS = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    store.set("result/live_s", std::to_string(liveS));
    store.set("result/hung", toHung.get());
    store.set("result/cpu_s", std::to_string(processCpuSeconds() - cpuStart));
  } else {
    Outcome in;
    std::vector<int> got(4, 0);
    p2p.recv(0, {.buf = got.data(),
                 .bytes = got.size() * sizeof(int),
                 .tag = 1,
                 .deadline = soon(),
                 .done = in.completion()});
    store.set("result/recv", in.get());
    store.set("result/got", std::to_string(got[0]));
  }
  storeBarrier(store, "hung-peer-done", 2, soon());  // ranks 0 and 2
}

ChildRegistrar hungPeerChild("p2p_hung_rank2", asRank(hungPeerRank, 2));

}  // namespace

TEST(p2p_a_peer_hung_in_the_handshake_holds_up_no_other_send) {
  char dirTemplate[] = "/tmp/smdccl-p2p-hung-XXXXXX";
  std::string dir = mkdtemp(dirTemplate);
  FileStore store(dir);
  // Rank 1's "listener": accepts in the kernel, never reads or answers.
  int silent = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  CHECK(bind(silent, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  CHECK(listen(silent, 16) == 0);
  CHECK(getsockname(silent, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  store.set("smdccl/addr/1", "127.0.0.1:" + std::to_string(ntohs(a.sin_port)));
  pid_t child = spawnChild("p2p_hung_rank2", dir);
  hungPeerRank(0, store);
  reapChild(child);
  close(silent);
  auto result = [&](const char* name) { return store.get(std::string("result/") + name, soon()); };
  std::string live = result("live"), hung = result("hung"), recv = result("recv");
  double liveS = std::stod(result("live_s"));
  std::fprintf(stderr, "  send to rank 2: '%s' after %.2f s\n  send to rank 1: '%s'\n",
               live.c_str(), liveS, hung.c_str());
  CHECK(live.empty() && recv.empty() && result("got") == "2");
  // Behind the hung dial it would take the hung send's deadline.
  CHECK(liveS < std::chrono::duration<double>(kHungDeadline).count() / 2);
  CHECK(hung.find("send to rank 1 (tag 1)") != std::string::npos);
  // Waiting for the hung dial costs (next to) nothing: no loop spins.
  double cpuS = std::stod(result("cpu_s"));
  std::fprintf(stderr, "  CPU time of rank 0's process while it waited: %.2f s\n", cpuS);
  // A fifth of the wait, as when the deadline was 10 s and the bound 2 s
  // (it takes about 0.01 s): a loop spinning part of the time still fails.
  CHECK(cpuS < std::chrono::duration<double>(kHungDeadline).count() / 5);
  std::system(("rm -rf " + dir).c_str());
}

// The send/recv loops are the process's; a child forked after they started
// has none of their threads, so it must make its own rather than attach
// engines to loops nobody runs.
TEST(p2p_a_forked_child_gets_loops_of_its_own) {
  P2PLoops* parent = &P2PLoops::instance();
  CHECK(P2PLoops::current() == parent);
  pid_t child = fork();
  if (child == 0) {
    bool fresh = P2PLoops::current() == nullptr && &P2PLoops::instance() != parent &&
                 P2PLoops::current() != parent;
    _exit(fresh ? 0 : 1);
  }
  CHECK(child > 0);
  reapChild(child);
  CHECK(P2PLoops::current() == parent);
}
