// The staged ring (algorithms/staged_ring.h) with the host stand-in for a
// device (HostStageDevice), ranks as threads: the same bits as the host
// ring on the same data for every wire, slot count and slot size (one slot
// per piece up to pieces much smaller than a block), with the device's work
// completing at once, a step per poll, or on lanes of its own behind gates
// (the GPU's mode: every copy queued before the proxy runs); bytes across the device boundary
// equal to the bytes on the wire (half with a 16-bit wire); a device that
// fails mid-pipeline fails the op on every rank; a device or a peer that
// never finishes runs into the deadline with a message that says so.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives.h"
#include "algorithms/host_stage_device.h"
#include "algorithms/staged_ring.h"
#include "check.h"
#include "common/error.h"
#include "memory_fabric.h"
#include "stuck_stage_device.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;
using smdccl::testing::StuckStageDevice;

namespace {

struct Case {
  std::vector<int> nodes;
  Wire wire;
  bool intra;
};

double valueOf(int r, size_t i) {
  uint64_t h =
      (i + 1) * 0x9e3779b97f4a7c15ull ^ (static_cast<uint64_t>(r) + 3) * 0xc2b2ae3d27d4eb4full;
  return static_cast<double>(static_cast<int64_t>(h >> 40) % 20001 - 10000) / 997.0;
}

void fill(std::vector<char>& buf, DType dt, int r, size_t n) {
  buf.assign(n * elementSize(dt), 0);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::F32) {
      float v = static_cast<float>(valueOf(r, i));
      std::memcpy(buf.data() + i * 4, &v, 4);
    } else {  // I64: exact whatever the order of the sums
      int64_t v = static_cast<int64_t>(valueOf(r, i) * 997.0);
      std::memcpy(buf.data() + i * 8, &v, 8);
    }
  }
}

using Mode = HostStageDevice::Mode;

const char* modeName(Mode m) {
  return m == Mode::Immediate  ? "immediate"
         : m == Mode::Deferred ? "deferred"
         : m == Mode::Gated    ? "gated"
                               : "gated, one queue";
}

std::string caseName(const Case& k, DType dt, RedOp op, size_t n, const StagePlan& plan,
                     Mode mode) {
  std::string nodes;
  for (int x : k.nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(x);
  return "nodes " + nodes + " wire " + wireName(k.wire) + (k.intra ? " intra" : "") + " dt " +
         std::to_string(static_cast<int>(dt)) + " op " + std::to_string(static_cast<int>(op)) +
         " n=" + std::to_string(n) + " slot " + std::to_string(plan.slotBytes) + "x" +
         std::to_string(plan.slots) + " chunk " + std::to_string(plan.chunkBytes) + " " +
         modeName(mode);
}

// Runs `check` for every case, dtype/op, size and plan on every rank (the
// device's mode in turn: immediate, deferred, gated, gated on one queue); returns the failures
// ("" from check: passed) and counts rank 0's checks in *checked.
using StagedCheck = std::function<std::string(int r, Comm& c, DType dt, RedOp op, size_t n,
                                              const StagePlan& plan, Mode mode)>;
std::vector<std::string> runStagedMatrix(const std::vector<Case>& cases,
                                         const std::vector<size_t>& sizes,
                                         const std::vector<StagePlan>& plans,
                                         const std::vector<std::pair<DType, RedOp>>& ops,
                                         const StagedCheck& check, int* checked) {
  std::mutex mu;
  std::vector<std::string> failures;
  for (const Case& k : cases) {
    MemoryFabric fabric(k.nodes);
    std::string error = fabric.run([&](int r, Comm& c) {
      c.wire = k.wire;
      c.wireIntra = k.intra;
      int variant = 0;
      for (auto [dt, op] : ops)
        for (size_t n : sizes)
          for (const StagePlan& plan : plans) {
            const Mode mode = static_cast<Mode>(variant++ % 4);
            std::string why = check(r, c, dt, op, n, plan, mode);
            std::lock_guard<std::mutex> lock(mu);
            if (!why.empty())
              failures.push_back("rank " + std::to_string(r) + ": " +
                                 caseName(k, dt, op, n, plan, mode) + ": " + why);
            if (r == 0) ++*checked;
          }
    });
    if (!error.empty()) failures.push_back(error);
  }
  for (size_t i = 0; i < failures.size() && i < 10; ++i)
    std::fprintf(stderr, "  FAIL %s\n", failures[i].c_str());
  return failures;
}

// What a staged schedule run on a host device in `mode` moved: the bytes
// it sent over the links, and those its device copied out and back in.
struct Counted {
  uint64_t sent, toHost, fromHost;
};
Counted runCounted(Comm& c, const StagePlan& plan, Mode mode,
                   const std::function<void(StageDevice&, char* slots)>& schedule) {
  HostStageDevice device(mode);
  std::vector<char> slots(plan.hostBytes());
  uint64_t sent = 0;
  struct Counting {  // also when the schedule throws
    Comm& c;
    ~Counting() { c.ctx.sentBytes = nullptr; }
  } counting{c};
  c.ctx.sentBytes = &sent;
  schedule(device, slots.data());
  return {sent, device.bytesToHost(), device.bytesFromHost()};
}

}  // namespace

TEST(staged_ring_matches_host_ring_bits) {
  const std::vector<Case> cases = {{{4}, Wire::F32, false},        {{2, 2}, Wire::F16, false},
                                   {{1, 1, 1}, Wire::BF16, false}, {{3, 2}, Wire::F16, false},
                                   {{5}, Wire::F16, true},         {{1, 1}, Wire::F32, false}};
  // A piece per 16 elements in one slot; 1 KiB pieces in 2 slots, 8 KiB
  // chunks (each its own ring); everything in one piece.
  const std::vector<StagePlan> plans = {{64, 1}, {1024, 2, 8192}, {1u << 20, 4}};
  int checked = 0;
  auto check = [](int r, Comm& c, DType dt, RedOp op, size_t n, const StagePlan& plan,
                  Mode mode) -> std::string {
    std::vector<char> ref, buf;
    fill(ref, dt, r, n);
    buf = ref;
    const size_t es = elementSize(dt);
    const size_t chunk = plan.chunkBytes ? plan.chunkBytes / es : n;
    for (size_t at = 0; at < n; at += chunk)
      ringAllreduce(c, ref.data() + at * es, std::min(chunk, n - at), dt, op);
    const Counted got = runCounted(c, plan, mode, [&](StageDevice& d, char* slots) {
      stagedRingAllreduce(c, d, {.buf = buf.data(), .count = n, .dt = dt, .op = op}, slots, plan);
    });
    if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
      return "bits differ from the host ring";
    // Every byte on the wire was packed by the device, every byte received
    // was unpacked by it; a ring receives what it sends give or take one
    // element per block.
    if (got.toHost != got.sent) return "bytes to host != bytes sent";
    if (n >= static_cast<size_t>(c.size()) && got.fromHost == 0) return "nothing came back";
    return "";
  };
  auto failures = runStagedMatrix(
      cases, {1, 7, 1021, 16411}, plans,
      {{DType::F32, RedOp::Sum}, {DType::F32, RedOp::Max}, {DType::I64, RedOp::Sum}}, check,
      &checked);
  CHECK(failures.empty());
  CHECK(checked == static_cast<int>(cases.size() * 3 * 4 * 3));
}

// reduce_scatter_tensor's staged ring: every rank's block cut alike into
// chunks; the rank's own block has the host ring reduce-scatter's bits.
TEST(staged_ring_reduce_scatter_matches_host_ring_bits) {
  const std::vector<Case> cases = {{{4}, Wire::F32, false},
                                   {{2, 2}, Wire::F16, false},
                                   {{1, 1, 1}, Wire::BF16, false},
                                   {{3, 2}, Wire::F16, false}};
  const std::vector<StagePlan> plans = {{64, 1}, {1024, 2, 8192}, {1u << 20, 4}};
  int checked = 0;
  // n: elements per rank's block.
  auto check = [](int r, Comm& c, DType dt, RedOp op, size_t each, const StagePlan& plan,
                  Mode mode) -> std::string {
    const size_t es = elementSize(dt), p = static_cast<size_t>(c.size());
    std::vector<char> ref, buf;
    fill(ref, dt, r, each * p);
    buf = ref;
    ringReduceScatter(c, ref.data(), Blocks::equal(c.size(), each * es), dt, op);
    const Counted got = runCounted(c, plan, mode, [&](StageDevice& d, char* slots) {
      stagedRingReduceScatter(c, d, {.buf = buf.data(), .each = each, .dt = dt, .op = op}, slots,
                              plan);
    });
    const size_t mine = static_cast<size_t>(r) * each * es;
    if (std::memcmp(buf.data() + mine, ref.data() + mine, each * es) != 0)
      return "bits of this rank's block differ from the host ring's";
    if (got.toHost != got.sent) return "bytes to host != bytes sent";
    if (each * es >= 4 && got.fromHost == 0) return "nothing came back";
    return "";
  };
  auto failures = runStagedMatrix(
      cases, {1, 7, 1021, 4099}, plans,
      {{DType::F32, RedOp::Sum}, {DType::F32, RedOp::Min}, {DType::I64, RedOp::Sum}}, check,
      &checked);
  CHECK(failures.empty());
  CHECK(checked == static_cast<int>(cases.size() * 3 * 4 * 3));
}

TEST(staged_ring_16_bit_wire_halves_the_device_bytes) {
  // One rank per node: every hop crosses, so the whole ring is on the wire.
  MemoryFabric fabric({1, 1, 1, 1});
  const size_t n = 100003;
  std::vector<uint64_t> bytes32(4), bytes16(4), to16(4), sent16(4);
  std::string error = fabric.run([&](int r, Comm& c) {
    StagePlan plan{16 << 10, 3};
    std::vector<char> slots(plan.hostBytes()), buf;
    for (Wire w : {Wire::F32, Wire::F16}) {
      c.wire = w;
      fill(buf, DType::F32, r, n);
      HostStageDevice device(Mode::Deferred);
      uint64_t sent = 0;
      c.ctx.sentBytes = &sent;
      stagedRingAllreduce(c, device,
                          {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
                          slots.data(), plan);
      c.ctx.sentBytes = nullptr;
      (w == Wire::F32 ? bytes32 : bytes16)[r] = device.bytesToHost() + device.bytesFromHost();
      if (w == Wire::F16) {
        to16[r] = device.bytesToHost();
        sent16[r] = sent;
      }
    }
  });
  CHECK(error.empty());
  // Out and back in, each 2 (p-1)/p of the float32 data, give or take an
  // element per block.
  const double expected = 2.0 * 2 * 3 * n * 4 / 4;
  for (int r = 0; r < 4; ++r) {
    CHECK(std::fabs(static_cast<double>(bytes32[r]) - expected) <= 64);
    CHECK(bytes16[r] * 2 == bytes32[r]);
    CHECK(to16[r] == sent16[r]);
  }
}

namespace {

// A device (deferred, on the host) whose copies out fail from the
// `failAt`-th one let go on, on one rank.
class FailingDevice final : public StageDevice {
 public:
  FailingDevice(bool fails, uint64_t failAt) : fails_(fails), failAt_(failAt) {}

 protected:
  void planned(int lane, uint64_t number, const Copy& c) override { copies_[lane].push_back(c); }
  void release(int lane, uint64_t number) override {
    if (fails_ && lane == 0 && number >= failAt_)
      throw CommError(CommError::Kind::System, "test device: copy to host failed");
    while (released_[lane] < number) pending_[lane].push_back(copies_[lane][released_[lane]++]);
  }
  bool ran(int lane, uint64_t number) override {
    if (ran_[lane] < number && !pending_[lane].empty()) {  // one per poll
      HostStageDevice::run(pending_[lane].front());
      pending_[lane].pop_front();
      ++ran_[lane];
    }
    return ran_[lane] >= number;
  }
  void dropPlanned(int, uint64_t, uint64_t) override {}

 private:
  bool fails_;
  uint64_t failAt_;
  std::vector<Copy> copies_[2];
  std::deque<Copy> pending_[2];
  uint64_t released_[2] = {0, 0}, ran_[2] = {0, 0};
};

}  // namespace

TEST(staged_ring_device_failure_mid_pipeline_fails_every_rank) {
  MemoryFabric fabric({2, 2});
  std::atomic<int> failed{0};
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.wire = Wire::F16;
        const size_t n = 50000;
        StagePlan plan{4 << 10, 2};  // many pieces: the failure comes mid-pipeline
        std::vector<char> slots(plan.hostBytes()), buf;
        fill(buf, DType::F32, r, n);
        FailingDevice device(r == 1, 9);
        try {
          stagedRingAllreduce(c, device,
                              {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
                              slots.data(), plan);
        } catch (const CommError&) {
          ++failed;
          throw;
        }
      },
      20);
  CHECK(error.find("test device: copy to host failed") != std::string::npos ||
        error.find("aborted") != std::string::npos);
  CHECK(failed.load() == 4);  // nobody finished, nobody hung
}

TEST(staged_ring_stuck_device_times_out_naming_it) {
  MemoryFabric fabric({1, 1});
  std::mutex mu;
  std::vector<std::string> errors;
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        std::vector<char> buf(4096 * 4), slots(StagePlan{1024, 2}.hostBytes());
        StuckStageDevice device;
        try {
          stagedRingAllreduce(
              c, device, {.buf = buf.data(), .count = 4096, .dt = DType::F32, .op = RedOp::Sum},
              slots.data(), StagePlan{1024, 2});
        } catch (const CommError& e) {
          std::lock_guard<std::mutex> lock(mu);
          errors.push_back(std::string("rank ") + std::to_string(r) + ": " + e.what());
          throw;
        }
      },
      1);
  CHECK(!errors.empty());
  bool named = false;
  for (const auto& e : errors)
    named |=
        e.find("timed out") != std::string::npos && e.find("the device (") != std::string::npos;
  if (!named)
    for (const auto& e : errors) std::fprintf(stderr, "  got: %s\n", e.c_str());
  CHECK(named);
}

TEST(staged_ring_op_header_rides_the_first_slot) {
  // With a sequence number set, the first message on each link opens with
  // the op header, as in a real group; a size mismatch is caught by it.
  MemoryFabric fabric({1, 1, 1});
  std::string error = fabric.run([&](int r, Comm& c) {
    c.ctx.seq = 5;
    c.ctx.sig.name = "allreduce";
    c.ctx.sig.dtype = 6;
    c.ctx.sig.redop = 0;
    c.ctx.sig.count = 3000;
    c.wire = Wire::F16;
    std::vector<char> buf, ref, slots(StagePlan{2048, 2}.hostBytes());
    fill(buf, DType::F32, r, 3000);
    ref = buf;
    HostStageDevice device(Mode::Deferred);
    stagedRingAllreduce(c, device,
                        {.buf = buf.data(), .count = 3000, .dt = DType::F32, .op = RedOp::Sum},
                        slots.data(), StagePlan{2048, 2});
    c.ctx.seq = 6;
    ringAllreduce(c, ref.data(), 3000, DType::F32, RedOp::Sum);
    if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
      throw std::runtime_error("bits differ");
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

TEST(staged_ring_rejects_a_plan_without_slots) {
  MemoryFabric fabric({1});
  std::string error = fabric.run([&](int, Comm& c) {
    HostStageDevice device;
    std::vector<char> buf(16);
    CHECK_THROWS(stagedRingAllreduce(
                     c, device, {.buf = buf.data(), .count = 4, .dt = DType::F32, .op = RedOp::Sum},
                     nullptr, StagePlan{1024, 0}),
                 std::exception);
    CHECK_THROWS(stagedRingAllreduce(
                     c, device, {.buf = buf.data(), .count = 4, .dt = DType::F64, .op = RedOp::Sum},
                     nullptr, StagePlan{4, 1}),
                 std::exception);
  });
  CHECK(error.empty());
}

TEST(staged_ring_has_the_host_paths_bits_where_that_runs_the_ring) {
  // The GPU path stages 4 MiB chunks and hands each to allreduce(); where
  // the model picks the ring for them (large chunks between two nodes) the
  // staged ring must give exactly those results.
  MemoryFabric fabric({1, 1});
  int compared = 0;
  std::string error = fabric.run([&](int r, Comm& c) {
    c.wire = Wire::F16;
    Tuning t;
    const size_t chunk = (4u << 20) / 4, n = 2 * chunk + chunk / 2;
    for (size_t len : {chunk, n - 2 * chunk})
      if (std::string(allreduceAlgorithm(c, len, DType::F32, t)->name()) != "ring")
        throw std::runtime_error("the model no longer picks the ring for " + std::to_string(len) +
                                 " floats between two nodes: pick sizes where it does");
    std::vector<char> buf, ref;
    fill(buf, DType::F32, r, n);
    ref = buf;
    for (size_t at = 0; at < n; at += chunk)
      allreduce(c,
                {.buf = ref.data() + at * 4,
                 .count = std::min(chunk, n - at),
                 .dt = DType::F32,
                 .op = RedOp::Sum},
                t);
    StagePlan plan{1u << 20, 4, 4u << 20};
    std::vector<char> slots(plan.hostBytes());
    HostStageDevice device(Mode::Deferred);
    stagedRingAllreduce(c, device,
                        {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
                        slots.data(), plan);
    if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
      throw std::runtime_error("bits differ from allreduce() on the same chunks");
    if (r == 0) ++compared;
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
  CHECK(compared == 1);
}

TEST(staged_ring_gated_device_queues_every_copy_before_the_proxy_runs) {
  // The GPU's gated mode: planning queues the whole op on the device (so
  // the caller's stream can wait for its end at once); nothing may run
  // until the proxy lets it, and then the bits are the host ring's.
  MemoryFabric fabric({1, 1, 1});
  std::string error = fabric.run([&](int r, Comm& c) {
    c.wire = Wire::BF16;
    const size_t n = 20000;
    StagePlan plan{4096, 2, 16384};
    std::vector<char> buf, ref, slots(plan.hostBytes(), 0);
    fill(buf, DType::F32, r, n);
    ref = buf;
    for (size_t at = 0; at < n; at += 4096)
      ringAllreduce(c, ref.data() + at * 4, std::min<size_t>(4096, n - at), DType::F32, RedOp::Sum);
    HostStageDevice device(Mode::Gated);
    auto proxy = planStagedRingAllreduce(
        c, device, {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
        slots.data(), plan);
    // Out and back: 2 (p-1)/p of the data each way, in 16-bit values.
    const uint64_t each = 2 * 2 * n * 2 / 3;
    if (device.bytesToHost() + 16 < each || device.bytesFromHost() + 16 < each)
      throw std::runtime_error("not every copy was planned before the proxy ran");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    for (char b : slots)
      if (b != 0) throw std::runtime_error("a gated copy ran before the proxy let it go");
    proxy->run();
    if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
      throw std::runtime_error("bits differ from the host ring");
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

TEST(staged_ring_gated_devices_drain_when_a_peer_dies_mid_pipeline) {
  // Rank 2 fails after part of the ring: the others' proxies fail, their
  // planned copies are let go (nothing waits behind a closed gate for
  // ever) and the devices go away; nobody hangs.
  MemoryFabric fabric({2, 2});
  std::atomic<int> failed{0};
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.wire = Wire::F16;
        const size_t n = 60000;
        StagePlan plan{2048, 2};
        std::vector<char> slots(plan.hostBytes()), buf;
        fill(buf, DType::F32, r, n);
        HostStageDevice device(Mode::Gated);
        auto proxy = planStagedRingAllreduce(
            c, device, {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
            slots.data(), plan);
        if (r == 2) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
          ++failed;
          throw CommError(CommError::Kind::System, "rank 2 died");
        }
        try {
          proxy->run();
        } catch (const CommError&) {
          ++failed;
          throw;
        }
      },
      20);
  CHECK(error.find("rank 2 died") != std::string::npos);
  CHECK(failed.load() == 4);
}

TEST(staged_ring_gated_on_one_queue_streams_steps_larger_than_the_links) {
  // Both lanes on one FIFO (streams sharing a hardware queue) and links
  // that hold far less than a ring step: a copy out that waits for the
  // peer's copies in must be planned after the copies in it needs, or both
  // ranks' queues stop behind closed gates.
  MemoryFabric fabric({1, 1}, /*ringBytes=*/1024);
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.ctx.deadline = Deadline::after(std::chrono::seconds(10));
        c.wire = Wire::F16;
        const size_t n = 20000;
        StagePlan plan{256, 2};
        std::vector<char> buf, ref, slots(plan.hostBytes());
        fill(buf, DType::F32, r, n);
        ref = buf;
        ringAllreduce(c, ref.data(), n, DType::F32, RedOp::Sum);
        HostStageDevice device(Mode::GatedOneQueue);
        stagedRingAllreduce(c, device,
                            {.buf = buf.data(), .count = n, .dt = DType::F32, .op = RedOp::Sum},
                            slots.data(), plan);
        if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
          throw std::runtime_error("bits differ from the host ring");
      },
      20);
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}
