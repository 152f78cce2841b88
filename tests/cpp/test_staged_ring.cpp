// The staged ring (algorithms/staged_ring.h) with the host stand-in for a
// device (HostStageDevice), ranks as threads: the same bits as the host
// ring on the same data for every wire, slot count and slot size (one slot
// per piece up to pieces much smaller than a block), with the device's work
// completing at once or a step per poll; bytes across the device boundary
// equal to the bytes on the wire (half with a 16-bit wire); a device that
// fails mid-pipeline fails the op on every rank; a device or a peer that
// never finishes runs into the deadline with a message that says so.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/collectives.h"
#include "algorithms/host_stage_device.h"
#include "algorithms/staged_ring.h"
#include "check.h"
#include "common/error.h"
#include "memory_fabric.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;

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

std::string caseName(const Case& k, DType dt, RedOp op, size_t n, const StagePlan& plan,
                     bool deferred) {
  std::string nodes;
  for (int x : k.nodes) nodes += (nodes.empty() ? "" : ",") + std::to_string(x);
  return "nodes " + nodes + " wire " + wireName(k.wire) + (k.intra ? " intra" : "") + " dt " +
         std::to_string(static_cast<int>(dt)) + " op " + std::to_string(static_cast<int>(op)) +
         " n=" + std::to_string(n) + " slot " + std::to_string(plan.slotBytes) + "x" +
         std::to_string(plan.slots) + " chunk " + std::to_string(plan.chunkBytes) +
         (deferred ? " deferred" : "");
}

// Runs `check` for every case, dtype/op, size and plan on every rank
// (deferred device every other time); returns the failures ("" from check:
// passed) and counts rank 0's checks in *checked.
using StagedCheck = std::function<std::string(int r, Comm& c, DType dt, RedOp op, size_t n,
                                              const StagePlan& plan, bool deferred)>;
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
            bool deferred = (variant++ % 2) == 1;
            std::string why = check(r, c, dt, op, n, plan, deferred);
            std::lock_guard<std::mutex> lock(mu);
            if (!why.empty())
              failures.push_back("rank " + std::to_string(r) + ": " +
                                 caseName(k, dt, op, n, plan, deferred) + ": " + why);
            if (r == 0) ++*checked;
          }
    });
    if (!error.empty()) failures.push_back(error);
  }
  for (size_t i = 0; i < failures.size() && i < 10; ++i)
    std::fprintf(stderr, "  FAIL %s\n", failures[i].c_str());
  return failures;
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
                  bool deferred) -> std::string {
    std::vector<char> ref, buf;
    fill(ref, dt, r, n);
    buf = ref;
    const size_t es = elementSize(dt);
    const size_t chunk = plan.chunkBytes ? plan.chunkBytes / es : n;
    for (size_t at = 0; at < n; at += chunk)
      ringAllreduce(c, ref.data() + at * es, std::min(chunk, n - at), dt, op);
    HostStageDevice device(deferred);
    std::vector<char> slots(plan.hostBytes());
    uint64_t sent = 0;
    c.ctx.sentBytes = &sent;
    stagedRingAllreduce(c, device, {.buf = buf.data(), .count = n, .dt = dt, .op = op},
                        slots.data(), plan);
    c.ctx.sentBytes = nullptr;
    if (std::memcmp(buf.data(), ref.data(), buf.size()) != 0)
      return "bits differ from the host ring";
    // Every byte on the wire was packed by the device, every byte received
    // was unpacked by it; a ring receives what it sends give or take one
    // element per block.
    if (device.bytesToHost() != sent) return "bytes to host != bytes sent";
    if (n >= static_cast<size_t>(c.size()) && device.bytesFromHost() == 0)
      return "nothing came back";
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
                  bool deferred) -> std::string {
    const size_t es = elementSize(dt), p = static_cast<size_t>(c.size());
    std::vector<char> ref, buf;
    fill(ref, dt, r, each * p);
    buf = ref;
    ringReduceScatter(c, ref.data(), Blocks::equal(c.size(), each * es), dt, op);
    HostStageDevice device(deferred);
    std::vector<char> slots(plan.hostBytes());
    uint64_t sent = 0;
    c.ctx.sentBytes = &sent;
    stagedRingReduceScatter(c, device, {.buf = buf.data(), .each = each, .dt = dt, .op = op},
                            slots.data(), plan);
    c.ctx.sentBytes = nullptr;
    const size_t mine = static_cast<size_t>(r) * each * es;
    if (std::memcmp(buf.data() + mine, ref.data() + mine, each * es) != 0)
      return "bits of this rank's block differ from the host ring's";
    if (device.bytesToHost() != sent) return "bytes to host != bytes sent";
    if (each * es >= 4 && device.bytesFromHost() == 0) return "nothing came back";
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
      HostStageDevice device(true);
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

// A device that fails at its `failAt`-th copy out on one rank.
class FailingDevice final : public StageDevice {
 public:
  FailingDevice(bool fails, int failAt) : fails_(fails), failAt_(failAt) {}
  bool done(Ticket t) override { return inner_.done(t); }

 protected:
  Ticket queueToHost(void* slot, const char* src, size_t n, DType dt, Wire w) override {
    if (fails_ && ++calls_ == failAt_)
      throw CommError(CommError::Kind::System, "test device: copy to host failed");
    return inner_.toHost(slot, src, n, dt, w);
  }
  Ticket queueFromHost(char* dst, const void* slot, size_t n, const Unpack& how) override {
    return inner_.fromHost(dst, slot, n, how);
  }

 private:
  HostStageDevice inner_{true};
  bool fails_;
  int failAt_;
  int calls_ = 0;
};

// A device whose work never finishes.
class StuckDevice final : public StageDevice {
 public:
  bool done(Ticket) override { return false; }

 protected:
  Ticket queueToHost(void*, const char*, size_t, DType, Wire) override { return 1; }
  Ticket queueFromHost(char*, const void*, size_t, const Unpack&) override { return 2; }
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
        StuckDevice device;
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
    HostStageDevice device(true);
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
    HostStageDevice device(true);
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
