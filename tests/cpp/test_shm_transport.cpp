// Shared-memory links between two "ranks" that are threads of this process:
// ring wrap-around, message alignment, receive-and-reduce, and the deadline.
#include <sys/statvfs.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <vector>

#include "algorithms/exchange.h"
#include "check.h"
#include "memory_store.h"
#include "common/error.h"
#include "transport/shm_node.h"

using namespace smdccl;

namespace {

// Runs body(rank, link, bell, node) on two threads joined by a small shm ring.
void withTwoRanksNode(size_t ringBytes,
                      const std::function<void(int, Link&, Doorbell&, ShmNode&)>& body) {
  MemoryStore store;
  std::string token = "00112233445566778899aabbccddeeff";
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto node = std::make_shared<ShmNode>(store, token, std::vector<int>{0, 1}, r, ringBytes,
                                            Deadline::after(std::chrono::seconds(10)));
      ShmLink link(node, r, 1 - r);
      body(r, link, node->myBell(), *node);
    });
  }
  for (auto& t : threads) t.join();
}

void withTwoRanks(size_t ringBytes,
                  const std::function<void(int, Link&, Doorbell&)>& body) {
  withTwoRanksNode(ringBytes, [&](int r, Link& l, Doorbell& b, ShmNode&) { body(r, l, b); });
}

}  // namespace

TEST(shm_ring_wraps_and_keeps_messages_aligned) {
  // Messages of odd sizes through a 4 KiB ring: many wrap-arounds.
  std::vector<size_t> sizes = {1, 4095, 4096, 10001, 3, 70000};
  withTwoRanks(4096, [&](int rank, Link& link, Doorbell& bell) {
    OpContext ctx;
    ctx.op = "test";
    ctx.deadline = Deadline::after(std::chrono::seconds(10));
    for (size_t n : sizes) {
      std::vector<uint8_t> out(n), in(n);
      for (size_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(i * 7 + rank);
      Exchange(ctx, &bell).send(link, out.data(), n).recv(link, in.data(), n).run();
      for (size_t i = 0; i < n; ++i)
        if (in[i] != static_cast<uint8_t>(i * 7 + (1 - rank))) {
          CHECK(false && "payload mismatch");
          break;
        }
    }
  });
}

TEST(shm_recv_reduce_float) {
  withTwoRanks(8192, [&](int rank, Link& link, Doorbell& bell) {
    OpContext ctx;
    ctx.op = "test";
    ctx.deadline = Deadline::after(std::chrono::seconds(10));
    size_t n = 12345;
    std::vector<float> mine(n), acc(n);
    for (size_t i = 0; i < n; ++i) mine[i] = acc[i] = static_cast<float>(i % 100) * (rank + 1);
    Exchange(ctx, &bell)
        .send(link, mine.data(), n * 4)
        .recvReduce(link, acc.data(), n * 4, DType::F32, RedOp::Sum)
        .run();
    for (size_t i = 0; i < n; ++i) CHECK(acc[i] == static_cast<float>(i % 100) * 3);
  });
}

TEST(exchange_times_out_naming_the_peer) {
  withTwoRanks(4096, [&](int rank, Link& link, Doorbell& bell) {
    if (rank == 1) return;  // never sends
    OpContext ctx;
    ctx.op = "allreduce";
    ctx.deadline = Deadline::after(std::chrono::milliseconds(300));
    char buf[16];
    std::string msg;
    try {
      Exchange(ctx, &bell).recv(link, buf, 8).recv(link, buf + 8, 8).run();
    } catch (const CommError& e) {
      msg = e.what();
    }
    CHECK(msg.find("timed out") != std::string::npos);
    CHECK(msg.find("allreduce") != std::string::npos);
    // transfers to one peer are summed up, not listed one by one
    CHECK(msg.find("receiving from rank 1 (0 of 16 bytes in 2 transfers, shm)") != std::string::npos);
  });
}

TEST(exchange_fails_at_once_when_a_local_peer_gave_up) {
  // Rank 1 is alive but a collective failed there (Mesh::abortLinks): rank 0,
  // waiting on it over shared memory, must stop long before its deadline.
  withTwoRanksNode(4096, [&](int rank, Link& link, Doorbell& bell, ShmNode& node) {
    if (rank == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      node.markFailed();
      return;
    }
    OpContext ctx;
    ctx.op = "allreduce";
    ctx.deadline = Deadline::after(std::chrono::seconds(20));
    ctx.wait.spinUs = 0;
    char buf[16];
    std::string msg;
    auto t0 = std::chrono::steady_clock::now();
    try {
      Exchange(ctx, &bell, &node).recv(link, buf, sizeof buf).run();
    } catch (const CommError& e) {
      msg = e.what();
    }
    auto took = std::chrono::steady_clock::now() - t0;
    CHECK(msg.find("rank 1 (same node) stopped") != std::string::npos);
    CHECK(msg.find("allreduce") != std::string::npos);
    CHECK(took < std::chrono::seconds(2));
  });
}

TEST(exchange_keeps_message_order_through_zero_length_transfers) {
  // A 0-byte message between two others must not let the third start early
  // (the streaming ring chains transfers with `after`).
  withTwoRanks(4096, [&](int rank, Link& link, Doorbell& bell) {
    OpContext ctx;
    ctx.op = "test";
    ctx.deadline = Deadline::after(std::chrono::seconds(10));
    Exchange ex(ctx, &bell);
    if (rank == 0) {
      char a[5] = {1, 2, 3, 4, 5}, c[3] = {7, 8, 9};
      ex.send(link, a, 5);
      ex.send(link, nullptr, 0, {0, -1});
      ex.send(link, c, 3, {1, -1});
      ex.run();
    } else {
      char a[5] = {0}, c[3] = {0};
      ex.recv(link, a, 5);
      ex.recv(link, nullptr, 0, {0, -1});
      ex.recv(link, c, 3, {1, -1});
      ex.run();
      CHECK(a[0] == 1 && a[4] == 5);
      CHECK(c[0] == 7 && c[2] == 9);
    }
  });
}

// A node segment larger than /dev/shm's free space: the leader fails at
// creation with what to do (not SIGBUS at first touch), allocating nothing,
// and the other local rank fails at once with the leader's reason.
TEST(shm_segment_too_large_for_dev_shm_fails_on_every_local_rank) {
  struct statvfs vfs {};
  CHECK(statvfs("/dev/shm", &vfs) == 0);
  size_t freeBytes = static_cast<size_t>(vfs.f_bavail) * vfs.f_frsize;
  size_t ring = freeBytes / 4 + (size_t(1) << 30);  // 4 rings for 2 ranks: over by >= 4 GiB
  MemoryStore store;
  std::string token = "ffeeddccbbaa99887766554433221100";
  std::string errors[2];
  std::vector<std::thread> threads;
  auto start = std::chrono::steady_clock::now();
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ShmNode node(store, token, std::vector<int>{0, 1}, r, ring, Deadline::after(std::chrono::seconds(20)));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(errors[0].find("MiB free: enlarge /dev/shm") != std::string::npos);
  CHECK(errors[0].find("SMDCCL_SHM_RING_KB") != std::string::npos);
  CHECK(errors[1].find("rank 0, which creates this node's shared memory, failed") != std::string::npos);
  CHECK(errors[1].find("enlarge /dev/shm") != std::string::npos);
  CHECK(took < 5.0);
}
