// Shared-memory links between two "ranks" that are threads of this process:
// ring wrap-around, message alignment, receive-and-reduce, the deadline, and
// send/recv's ring with its wake-ups over a socket.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
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
#include "transport/p2p_shm_stream.h"
#include "transport/shm_node.h"
#include "transport/shm_segment.h"

using namespace smdccl;

namespace {

// Runs body(rank, link, bell, node) on two threads joined by a small shm ring.
void withTwoRanksNode(size_t ringBytes,
                      const std::function<void(int, Link&, Doorbell&, ShmNode&)>& body) {
  MemoryStore store;
  // The segment's name comes from the token: one per process, so that
  // shards of this binary running at once do not meet in /dev/shm.
  char token[33];
  std::snprintf(token, sizeof token, "%016llx8899aabbccddeeff", static_cast<unsigned long long>(getpid()));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto node = std::make_shared<ShmNode>(store, ShmNode::Members{token, {0, 1}, r, ringBytes},
                                            Deadline::after(std::chrono::seconds(10)));
      ShmLink link(node, r, 1 - r);
      body(r, link, node->myBell(), *node);
    });
  }
  for (auto& t : threads) t.join();
}

void withTwoRanks(size_t ringBytes, const std::function<void(int, Link&, Doorbell&)>& body) {
  withTwoRanksNode(ringBytes, [&](int r, Link& l, Doorbell& b, ShmNode&) { body(r, l, b); });
}

}  // namespace

TEST(shm_ring_wraps_and_keeps_messages_aligned) {
  // Messages of odd sizes through a 4 KiB ring: many wrap-arounds.
  std::vector<size_t> sizes = {1, 4095, 4096, 10001, 3, 70000};
  withTwoRanks(4096, [&](int rank, Link& link, Doorbell& bell) {
    OpContext ctx;
    ctx.opName = "test";
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

// Streamed copies into the ring (SMDCCL_SHM_COPY=streamed), and auto's
// changes between the ways (three rings of each first, SMDCCL_DEBUG=TRACE
// shows them): payloads intact,
// from sources at every offset mod 16 and pieces split at the ring's end.
TEST(shm_ring_carries_messages_whichever_way_it_copies) {
  const std::vector<size_t> sizes = {1, 4097, 65536 + 13, (1 << 20) + 5, 300000, 64 << 10};
  for (const char* mode : {"streamed", "auto"}) {
    setenv("SMDCCL_SHM_COPY", mode, 1);
    withTwoRanks(256 << 10, [&](int rank, Link& link, Doorbell& bell) {
      OpContext ctx;
      ctx.opName = "test";
      ctx.deadline = Deadline::after(std::chrono::seconds(20));
      int bad = 0;
      for (int round = 0; round < 3; ++round)
        for (size_t k = 0; k < sizes.size(); ++k) {
          const size_t n = sizes[k], skew = (k * 5 + round) % 16;
          std::vector<uint8_t> out(n + skew), in(n);
          for (size_t i = 0; i < n; ++i) out[skew + i] = static_cast<uint8_t>(i * 7 + rank + k);
          Exchange(ctx, &bell).send(link, out.data() + skew, n).recv(link, in.data(), n).run();
          for (size_t i = 0; i < n; ++i)
            bad += in[i] != static_cast<uint8_t>(i * 7 + (1 - rank) + k);
        }
      CHECK(bad == 0);
    });
  }
  unsetenv("SMDCCL_SHM_COPY");
}

// A message that ends with the ring exactly full and is padded to the
// alignment leaves the writer's position past the reader's tail + capacity:
// the next message must wait for the reader, not overwrite what it has not
// read (the free space once wrapped round to ~2^64; the staged ring's
// reduce-scatter test saw wrong I64 sums under load, 2026-11-27).
TEST(shm_ring_padding_past_a_full_ring_waits_for_the_reader) {
  constexpr size_t kRing = 4096;
  std::atomic<int> phase{0};
  auto waitFor = [&](int p) {
    while (phase.load() < p) std::this_thread::yield();
  };
  withTwoRanks(kRing, [&](int rank, Link& link, Doorbell&) {
    auto pattern = [](size_t i, int salt) { return static_cast<uint8_t>(i * 13 + salt); };
    std::vector<uint8_t> a(24), b(kRing - 24);  // 24 + 4072 bytes: b is 8 mod 16
    for (size_t i = 0; i < a.size(); ++i) a[i] = pattern(i, 1);
    for (size_t i = 0; i < b.size(); ++i) b[i] = pattern(i, 2);
    if (rank == 0) {
      CHECK(link.send(a.data(), a.size()) == a.size());
      link.endSend();  // padded to 32
      phase = 1;
      waitFor(2);  // the reader took 8 bytes of a: its tail is 8
      size_t sent = 0;
      while (sent < b.size()) sent += link.send(b.data() + sent, b.size() - sent);
      link.endSend();  // the ring is full at 4104 = 8 + 4096; padded to 4112
      uint8_t c[16] = {};
      CHECK(link.send(c, sizeof(c)) == 0);  // no room until the reader moves
      phase = 3;
    } else {
      waitFor(1);
      std::vector<uint8_t> got(a.size()), gotB(b.size());
      CHECK(link.recv(got.data(), 8) == 8);
      phase = 2;
      waitFor(3);
      size_t n = 8;
      while (n < got.size()) n += link.recv(got.data() + n, got.size() - n);
      link.endRecv();
      n = 0;
      while (n < gotB.size()) n += link.recv(gotB.data() + n, gotB.size() - n);
      link.endRecv();
      CHECK(got == a);
      CHECK(gotB == b);
    }
  });
}

TEST(shm_recv_reduce_float) {
  withTwoRanks(8192, [&](int rank, Link& link, Doorbell& bell) {
    OpContext ctx;
    ctx.opName = "test";
    ctx.deadline = Deadline::after(std::chrono::seconds(10));
    size_t n = 12345;
    std::vector<float> mine(n), acc(n);
    for (size_t i = 0; i < n; ++i) mine[i] = acc[i] = static_cast<float>(i % 100) * (rank + 1);
    Exchange(ctx, &bell)
        .send(link, mine.data(), n * 4)
        .recvReduce(link, acc.data(), n * 4, {DType::F32, RedOp::Sum})
        .run();
    for (size_t i = 0; i < n; ++i) CHECK(acc[i] == static_cast<float>(i % 100) * 3);
  });
}

TEST(exchange_times_out_naming_the_peer) {
  withTwoRanks(4096, [&](int rank, Link& link, Doorbell& bell) {
    if (rank == 1) return;  // never sends
    OpContext ctx;
    ctx.opName = "allreduce";
    ctx.deadline = Deadline::after(std::chrono::milliseconds(300));
    char buf[16];
    std::string msg;
    try {
      Exchange(ctx, &bell).recv(link, buf, 8).recv(link, buf + 8, 8).run();
    } catch (const CommError& e) { msg = e.what(); }
    CHECK(msg.find("timed out") != std::string::npos);
    CHECK(msg.find("allreduce") != std::string::npos);
    // transfers to one peer are summed up, not listed one by one
    CHECK(msg.find("receiving from rank 1 (0 of 16 bytes in 2 transfers, shm)") !=
          std::string::npos);
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
    ctx.opName = "allreduce";
    ctx.deadline = Deadline::after(std::chrono::seconds(20));
    ctx.wait.spinUs = 0;
    char buf[16];
    std::string msg;
    auto t0 = std::chrono::steady_clock::now();
    try {
      Exchange(ctx, &bell, &node).recv(link, buf, sizeof buf).run();
    } catch (const CommError& e) { msg = e.what(); }
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
    ctx.opName = "test";
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

// Rings larger than /dev/shm can hold (its free space / 4 + 1 GiB each, 4
// rings for 2 ranks, and as many send/recv rings): the leader shrinks them
// to fit instead of a segment that would SIGBUS when filled, and the other
// rank uses the leader's sizes.
// Pages stay lazy, so nothing of the size is allocated here.
TEST(shm_rings_shrink_to_fit_dev_shm_on_every_local_rank) {
  uint64_t freeBytes = ShmSegment::freeBytes();
  CHECK(freeBytes != UINT64_MAX);
  size_t asked = static_cast<size_t>(freeBytes / 4 + (uint64_t(1) << 30));
  size_t got[2] = {0, 0}, stream[2] = {0, 0};
  withTwoRanksNode(asked, [&](int r, Link& link, Doorbell& bell, ShmNode& node) {
    got[r] = node.ringBytes();
    stream[r] = node.streamBytes();
    OpContext ctx;
    ctx.opName = "test";
    ctx.deadline = Deadline::after(std::chrono::seconds(10));
    int v = 41 + r, w = 0;
    Exchange(ctx, &bell).send(link, &v, sizeof v).recv(link, &w, sizeof w).run();
    CHECK(w == 42 - r);
  });
  CHECK(got[0] == got[1]);
  CHECK(got[0] < asked && got[0] >= (size_t(64) << 10));
  // The send/recv rings gave way first, to none (send/recv goes over TCP),
  // before the collective rings shrank; what is left fits.
  CHECK(stream[0] == 0 && stream[1] == 0);
  CHECK(4 * static_cast<uint64_t>(got[0]) <= freeBytes);
  // Room for the collective rings and half as much again: they keep their
  // size, and only the send/recv rings shrink (to a half or a quarter).
  freeBytes = ShmSegment::freeBytes();
  asked = static_cast<size_t>(freeBytes / 6) / 4096 * 4096;
  withTwoRanksNode(asked, [&](int r, Link&, Doorbell&, ShmNode& node) {
    got[r] = node.ringBytes();
    stream[r] = node.streamBytes();
  });
  CHECK(got[0] == asked && got[1] == asked);
  CHECK(stream[0] == stream[1] && stream[0] > 0 && stream[0] < asked);
}

// send/recv's ring between two ranks of a node: 3 MiB through 4 KiB rings,
// each side sleeping in poll() on the socket whenever the ring is empty or
// full, as the loops do. A wake-up that is lost shows as a poll that times
// out (a second, where every wake-up comes in microseconds); after the
// writer closes its socket the reader still gets what is in the ring, and
// then the peer failure.
TEST(shm_stream_wakes_each_side_and_reads_on_after_the_writer_closed) {
  int fds[2];
  CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  const size_t n = (size_t(3) << 20) + 333, tail = 100;
  std::vector<char> data(n + tail), got(n + tail);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 37 + 11);
  std::atomic<int> stalls{0};
  auto sleepOn = [&](int fd) {
    pollfd pf{fd, POLLIN, 0};
    if (poll(&pf, 1, 1000) == 0) ++stalls;
  };
  size_t ringBytes[2] = {0, 0}, streamBytes[2] = {0, 0};
  withTwoRanksNode(4096, [&](int r, Link&, Doorbell&, ShmNode& node) {
    ringBytes[r] = node.ringBytes();
    streamBytes[r] = node.streamBytes();
    if (r == 0) {
      P2PShmWriter w(node, 0, 1, fds[0], "rank 1");
      for (size_t sent = 0; sent < data.size();) {
        w.takeWakeUps();
        size_t k = w.write(data.data() + sent, data.size() - sent);
        sent += k;
        if (k == 0) sleepOn(fds[0]);
      }
      close(fds[0]);  // what is in the ring stays readable
      return;
    }
    P2PShmReader rd(node, 1, 0, fds[1], "rank 0");
    for (size_t in = 0; in < n;) {
      rd.takeWakeUps();
      size_t k = rd.take(got.data() + in, n - in);
      in += k;
      if (k == 0 && rd.sleepOn()) sleepOn(fds[1]);
    }
    bool failed = false;
    for (size_t in = n; !failed;) {
      rd.takeWakeUps();
      try {
        size_t k = rd.take(got.data() + in, got.size() - in);
        in += k;
        if (k == 0 && rd.sleepOn()) sleepOn(fds[1]);
      } catch (const CommError& e) {
        failed = e.kind() == CommError::Kind::PeerFailure && in == got.size();
        CHECK(std::strstr(e.what(), "rank 0 closed the connection") != nullptr);
        break;
      }
    }
    CHECK(failed);
  });
  close(fds[1]);
  CHECK(ringBytes[0] == 4096 && streamBytes[0] == 4096 && streamBytes[1] == 4096);
  CHECK(stalls.load() == 0);
  CHECK(got == data);
}
