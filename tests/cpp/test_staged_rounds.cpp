// Staged rounds (algorithms/staged_rounds.h) with the host stand-in for a
// device, ranks as threads: the GPU's fallback allreduce (a host allreduce
// per chunk through a few slots in turn), its staged reduce-scatter and
// allgather (one round each) give exactly what the host collectives give on
// the same data, in every device mode and for slot counts from 1 to more
// than the rounds; packed to a 16-bit wire, the host collective's bits on
// wire-rounded inputs with half the device bytes; a device that never
// finishes runs into the deadline with a message naming it; an aborted
// group stops the wait; a device failing mid-pipeline fails every rank.
// The jobs are the GPU paths' (staged_collectives.h).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/collectives.h"
#include "host_stage_device.h"
#include "algorithms/staged_collectives.h"
#include "algorithms/staged_rounds.h"
#include "check.h"
#include "common/error.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/reduce.h"
#include "memory_fabric.h"
#include "stuck_stage_device.h"

using namespace smdccl;
using smdccl::testing::MemoryFabric;
using smdccl::testing::StuckStageDevice;
using Mode = HostStageDevice::Mode;

namespace {

const Tuning kTuning{};

// The GPU's fallback allreduce (allreduceRounds) in `slots` slots.
StagedRoundsJob chunkedAllreduce(const Comm& c, float* buf, size_t n, size_t chunk, int slots) {
  StagedRoundsJob job = allreduceRounds(
      c, {.buf = reinterpret_cast<char*>(buf), .count = n, .dt = DType::F32, .op = RedOp::Sum},
      chunk * 4, kTuning);
  job.slots = slots;
  return job;
}

// What the host path gives: the host allreduce of each chunk of v in turn.
void hostAllreduceByChunk(Comm& c, std::vector<float>& v, size_t chunk) {
  for (size_t at = 0; at < v.size(); at += chunk)
    allreduce(c,
              {.buf = reinterpret_cast<char*>(v.data() + at),
               .count = std::min(chunk, v.size() - at),
               .dt = DType::F32,
               .op = RedOp::Sum},
              kTuning);
}

// The staged allreduce of `buf` (float32, SUM) in chunks of `chunk`
// values on `device`.
void runStagedAllreduce(Comm& c, StageDevice& device, std::vector<float>& buf, size_t chunk) {
  StagedRoundsJob job = allreduceRounds(c,
                                        {.buf = reinterpret_cast<char*>(buf.data()),
                                         .count = buf.size(),
                                         .dt = DType::F32,
                                         .op = RedOp::Sum},
                                        chunk * 4, kTuning);
  std::vector<char> host(job.hostBytes());
  runStagedRounds(c.ctx, device, std::move(job), host.data());
}

// The staged reduce-scatter of `in` (c.size() blocks of `each` float32,
// SUM) into `out` on `device`; returns its rounds.
size_t runStagedReduceScatter(Comm& c, StageDevice& device, std::vector<float>& in,
                              std::vector<float>& out, size_t each) {
  StagedRoundsJob rs = reduceScatterRounds(c,
                                           {.in = reinterpret_cast<char*>(in.data()),
                                            .out = reinterpret_cast<char*>(out.data()),
                                            .each = each,
                                            .dt = DType::F32,
                                            .op = RedOp::Sum},
                                           kTuning);
  const size_t rounds = rs.rounds.size();
  std::vector<char> host(rs.hostBytes());
  runStagedRounds(c.ctx, device, std::move(rs), host.data());
  return rounds;
}

// The device mode of a test's `variant`-th case: every mode in turn, shifted
// by one every three cases, so that each mode meets each of three slot
// counts (or other inner choices) a loop varies.
Mode modeOf(int variant) {
  return static_cast<Mode>((variant + variant / 3) % HostStageDevice::kModes);
}

std::vector<float> valuesOf(int r, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = static_cast<float>(
               static_cast<int64_t>(((i + 1) * 2654435761u ^ (r + 7) * 40503u) % 2001) - 1000) /
           64.0f;
  return v;
}

}  // namespace

TEST(staged_rounds_allreduce_matches_the_host_on_every_chunk) {
  int checked = 0;
  std::mutex mu;
  std::vector<std::string> failures;
  for (std::vector<int> nodes : {std::vector<int>{1, 1}, {2, 2}, {1, 1, 1}}) {
    MemoryFabric fabric(nodes);
    std::string error = fabric.run([&](int r, Comm& c) {
      int variant = 0;
      for (size_t n : {size_t{1}, size_t{1000}, size_t{10007}})
        for (size_t chunk : {size_t{256}, size_t{4096}, size_t{20000}})
          for (int slots : {1, 2, 4}) {
            const Mode mode = modeOf(variant++);
            std::vector<float> buf = valuesOf(r, n), ref = buf;
            hostAllreduceByChunk(c, ref, chunk);
            HostStageDevice device(mode);
            StagedRoundsJob job = chunkedAllreduce(c, buf.data(), n, chunk, slots);
            std::vector<char> host(job.hostBytes());
            runStagedRounds(c.ctx, device, std::move(job), host.data());
            std::lock_guard<std::mutex> lock(mu);
            if (std::memcmp(buf.data(), ref.data(), n * 4) != 0)
              failures.push_back("rank " + std::to_string(r) + " n=" + std::to_string(n) +
                                 " chunk " + std::to_string(chunk) + " slots " +
                                 std::to_string(slots) + ": differs from the host allreduce");
            if (device.bytesToHost() != n * 4 || device.bytesFromHost() != n * 4)
              failures.push_back("rank " + std::to_string(r) + ": bytes across the device " +
                                 std::to_string(device.bytesToHost()) + " / " +
                                 std::to_string(device.bytesFromHost()) + ", expected " +
                                 std::to_string(n * 4) + " each way");
            if (r == 0) ++checked;
          }
    });
    if (!error.empty()) failures.push_back(error);
  }
  for (size_t i = 0; i < failures.size() && i < 10; ++i)
    std::fprintf(stderr, "  FAIL %s\n", failures[i].c_str());
  CHECK(failures.empty());
  CHECK(checked == 3 * 3 * 3 * 3);
}

// The slots a staged allreduce asks of the group's pinned buffer follow the
// tensor: under a chunk, one slot of its own size (a 4 KiB allreduce across
// nodes does not pin four 4 MiB slots, so the buffer can shrink after a
// burst), else chunks, at most kStagedRoundSlots of them; and the rounds in
// those slots still give the host path's bits.
TEST(staged_allreduce_slots_follow_the_tensor) {
  MemoryFabric fabric({1, 1});
  std::string error = fabric.run([&](int r, Comm& c) {
    const size_t chunk = 1024;
    for (size_t n : {size_t{1}, size_t{100}, chunk - 1, chunk, chunk + 1, 3 * chunk, 10 * chunk}) {
      std::vector<float> buf = valuesOf(r, n), ref = buf;
      hostAllreduceByChunk(c, ref, chunk);
      StagedRoundsJob job = allreduceRounds(c,
                                            {.buf = reinterpret_cast<char*>(buf.data()),
                                             .count = n,
                                             .dt = DType::F32,
                                             .op = RedOp::Sum},
                                            chunk * 4, kTuning);
      CHECK(job.slotBytes == std::min(n, chunk) * 4);
      CHECK(job.slots ==
            static_cast<int>(std::min<size_t>((n + chunk - 1) / chunk, kStagedRoundSlots)));
      HostStageDevice device(Mode::Lagging);
      std::vector<char> host(job.hostBytes());
      runStagedRounds(c.ctx, device, std::move(job), host.data());
      CHECK(std::memcmp(buf.data(), ref.data(), n * 4) == 0);
    }
  });
  CHECK(error.empty());
}

TEST(staged_rounds_reduce_scatter_and_allgather_match_the_host) {
  MemoryFabric fabric({2, 1});
  std::string error = fabric.run([&](int r, Comm& c) {
    const int p = c.size();
    int variant = 0;
    for (size_t each : {size_t{1}, size_t{333}, size_t{5000}})
      for (size_t roundBytes : {size_t{64}, size_t{4096}, size_t{1} << 20}) {
        const Mode mode = modeOf(variant++);
        HostStageDevice device(mode);
        // Reduce-scatter: every block out, the host reduce-scatter, this
        // rank's block back (one round, whatever its size).
        std::vector<float> in = valuesOf(r, each * p), out(each), ref = in;
        Blocks blocks = Blocks::equal(p, each * 4);
        reduceScatter(c,
                      {.buf = reinterpret_cast<char*>(ref.data()),
                       .dt = DType::F32,
                       .op = RedOp::Sum,
                       .blocks = &blocks},
                      kTuning);
        if (runStagedReduceScatter(c, device, in, out, each) != 1)
          throw std::runtime_error("reduce-scatter in several rounds");
        if (std::memcmp(out.data(), ref.data() + each * r, each * 4) != 0)
          throw std::runtime_error("reduce-scatter differs from the host's");
        // Allgather, in pieces of at most roundBytes a round (many rounds
        // for the small ones); from a block of its own and in place.
        std::vector<float> want;
        for (int q = 0; q < p; ++q) {
          std::vector<float> b = valuesOf(q + 10, each);
          want.insert(want.end(), b.begin(), b.end());
        }
        for (bool inPlace : {false, true}) {
          std::vector<float> mine = valuesOf(r + 10, each), all(each * p, -1.0f);
          if (inPlace) std::copy(mine.begin(), mine.end(), all.begin() + each * r);
          const char* src = inPlace ? reinterpret_cast<char*>(all.data() + each * r)
                                    : reinterpret_cast<char*>(mine.data());
          StagedRoundsJob ag = allgatherRounds(
              c, {.in = src, .out = reinterpret_cast<char*>(all.data()), .eachBytes = each * 4},
              roundBytes, kTuning);
          if (ag.slotBytes > std::max<size_t>(roundBytes, 16 * p))
            throw std::runtime_error("allgather rounds pin more than asked");
          std::vector<char> host2(ag.hostBytes());
          runStagedRounds(c.ctx, device, std::move(ag), host2.data());
          if (all != want)
            throw std::runtime_error("allgather differs (each " + std::to_string(each) +
                                     ", round bytes " + std::to_string(roundBytes) +
                                     (inPlace ? ", in place)" : ")"));
        }
      }
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

namespace {

// Inputs as `wire` holds them: with them, packing on the device changes
// nothing, so a packed staged op must give the host collective's bits.
std::vector<float> onWire(std::vector<float> v, Wire wire) {
  if (wire != Wire::F32) roundToWire(v.data(), v.size(), wire);
  return v;
}

const char* nameOf(Wire w) { return w == Wire::F16 ? "fp16" : w == Wire::BF16 ? "bf16" : "f32"; }

}  // namespace

// A compressed group's staged allreduce and reduce-scatter: the device packs
// float32 to the wire (half the bytes each way), the host widens, runs the
// host collective with its float32 sums and wire, and narrows the results
// exactly: the bits of the host collective on the same (wire-rounded)
// inputs, every chunk and tail, in every ungated device mode. Where no hop
// is compressed nothing is packed.
TEST(staged_rounds_pack_the_16_bit_wire_with_the_host_paths_bits) {
  struct Case {
    std::vector<int> nodes;
    Wire wire;
    bool intra;
  };
  const std::vector<Case> cases = {{{1, 1}, Wire::F16, false},     {{2, 2}, Wire::BF16, false},
                                   {{1, 1, 1}, Wire::F16, false},  {{3}, Wire::F16, true},
                                   {{3}, Wire::BF16, false}};
  std::mutex mu;
  std::vector<std::string> failures;
  int checked = 0;
  for (const Case& k : cases) {
    MemoryFabric fabric(k.nodes);
    std::string error = fabric.run([&](int r, Comm& c) {
      c.wire = k.wire;
      c.wireIntra = k.intra;
      const bool packs = c.resultWire(DType::F32) != Wire::F32;
      const Wire rounding = packs ? k.wire : Wire::F32;
      auto fail = [&](const std::string& what) {
        std::lock_guard<std::mutex> lock(mu);
        failures.push_back("rank " + std::to_string(r) + " " + nameOf(k.wire) + " nodes " +
                           std::to_string(k.nodes.size()) + ": " + what);
      };
      int variant = 0;
      for (size_t n : {size_t{1}, size_t{1000}, size_t{10007}})
        for (size_t chunk : {size_t{256}, size_t{4096}}) {
          const Mode mode = modeOf(variant++);
          std::vector<float> buf = valuesOf(r, n), ref = onWire(buf, rounding);
          hostAllreduceByChunk(c, ref, chunk);
          HostStageDevice device(mode);
          StagedRoundsJob job = chunkedAllreduce(c, buf.data(), n, chunk, 4);
          std::vector<char> host(job.hostBytes());
          runStagedRounds(c.ctx, device, std::move(job), host.data());
          const std::string at = " n=" + std::to_string(n) + " chunk " + std::to_string(chunk);
          if (std::memcmp(buf.data(), ref.data(), n * 4) != 0)
            fail("allreduce" + at + ": differs from the host allreduce");
          const size_t each = packs ? 2 : 4;
          if (device.bytesToHost() != n * each || device.bytesFromHost() != n * each)
            fail("allreduce" + at + ": " + std::to_string(device.bytesToHost()) + " / " +
                 std::to_string(device.bytesFromHost()) + " bytes across the device");
          // reduce_scatter_tensor's staged path: one round, every block.
          const size_t p = static_cast<size_t>(c.size()), per = n / 7 + 1;
          std::vector<float> in = valuesOf(r + 5, per * p), out(per, -1.0f);
          std::vector<float> rsRef = onWire(in, rounding);
          Blocks blocks = Blocks::equal(c.size(), per * 4);
          reduceScatter(c,
                        {.buf = reinterpret_cast<char*>(rsRef.data()),
                         .dt = DType::F32,
                         .op = RedOp::Sum,
                         .blocks = &blocks},
                        kTuning);
          const std::vector<float> inBefore = in;
          HostStageDevice rsDevice(mode);
          runStagedReduceScatter(c, rsDevice, in, out, per);
          if (std::memcmp(out.data(), rsRef.data() + per * r, per * 4) != 0)
            fail("reduce-scatter" + at + ": differs from the host reduce-scatter");
          if (in != inBefore) fail("reduce-scatter" + at + ": its input changed");
          if (rsDevice.bytesToHost() != per * p * each || rsDevice.bytesFromHost() != per * each)
            fail("reduce-scatter" + at + ": " + std::to_string(rsDevice.bytesToHost()) + " / " +
                 std::to_string(rsDevice.bytesFromHost()) + " bytes across the device");
          if (r == 0) {
            std::lock_guard<std::mutex> lock(mu);
            ++checked;
          }
        }
    });
    if (!error.empty()) failures.push_back(error);
  }
  for (size_t i = 0; i < failures.size() && i < 10; ++i)
    std::fprintf(stderr, "  FAIL %s\n", failures[i].c_str());
  CHECK(failures.empty());
  CHECK(checked == static_cast<int>(cases.size()) * 3 * 2);
}

// Arbitrary float32 inputs on a compressed group: every rank ends with the
// same bits, within the wire's bound of the float64 sum (each rank's input
// rounded once more than on a host tensor; docs/cuda.md).
TEST(staged_rounds_packed_results_agree_and_keep_the_wire_bound) {
  MemoryFabric fabric({1, 1, 1, 1});
  const size_t n = 5000;
  std::vector<std::vector<float>> got(4);
  std::string error = fabric.run([&](int r, Comm& c) {
    c.wire = Wire::F16;
    std::vector<float> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = std::sin(0.37f * i + r) * (1.0f + 0.01f * r);
    HostStageDevice device(Mode::Deferred);
    StagedRoundsJob job = chunkedAllreduce(c, buf.data(), n, 1024, 2);
    std::vector<char> host(job.hostBytes());
    runStagedRounds(c.ctx, device, std::move(job), host.data());
    got[r] = buf;
  });
  CHECK(error.empty());
  double worst = 0;
  for (size_t i = 0; i < n; ++i) {
    double exact = 0;
    for (int r = 0; r < 4; ++r) exact += std::sin(0.37f * i + r) * (1.0f + 0.01f * r);
    worst = std::max(worst, std::fabs(got[0][i] - exact));
    for (int r = 1; r < 4; ++r)
      if (std::memcmp(&got[r][i], &got[0][i], 4) != 0) worst = 1e9;
  }
  // |sum| <= 4.2: fp16's half step there is 2^-9; 4 input roundings, 3 sums
  // and the result, each at most half a step of a value below 8.
  CHECK(worst <= 8 * std::ldexp(1.0, -9));
}

namespace {

// A device (deferred, on the host) whose copies out fail from the
// `failAt`-th one queued on, on one rank.
class FailingDevice final : public StageDevice {
 public:
  FailingDevice(bool fails, uint64_t failAt) : fails_(fails), failAt_(failAt) {}

 protected:
  void queue(int lane, uint64_t number, const Copy& c) override {
    if (fails_ && lane == 0 && number >= failAt_)
      throw CommError(CommError::Kind::System, "test device: copy to host failed");
    pending_[lane].push_back(c);
  }
  bool ran(int lane, uint64_t number) override {
    if (ran_[lane] < number && !pending_[lane].empty()) {  // one per poll
      HostStageDevice::run(pending_[lane].front());
      pending_[lane].pop_front();
      ++ran_[lane];
    }
    return ran_[lane] >= number;
  }

 private:
  bool fails_;
  uint64_t failAt_;
  std::deque<Copy> pending_[2];
  uint64_t ran_[2] = {0, 0};
};

}  // namespace

// One rank's device fails mid-pipeline (its ninth copy out): that rank's
// op fails, and its peers', waiting for its data, fail too (the fabric
// aborts them as a dead peer's links do); nobody finishes, nobody hangs.
TEST(staged_rounds_device_failure_mid_pipeline_fails_every_rank) {
  MemoryFabric fabric({2, 2});
  std::atomic<int> failed{0};
  std::string error = fabric.run(
      [&](int r, Comm& c) {
        c.wire = Wire::F16;
        std::vector<float> buf = valuesOf(r, 50000);
        FailingDevice device(r == 1, 9);
        StagedRoundsJob job = chunkedAllreduce(c, buf.data(), buf.size(), 1024, 2);
        std::vector<char> host(job.hostBytes());
        try {
          runStagedRounds(c.ctx, device, std::move(job), host.data());
        } catch (const CommError&) {
          ++failed;
          throw;
        }
      },
      20);
  CHECK(error.find("test device: copy to host failed") != std::string::npos ||
        error.find("aborted") != std::string::npos);
  CHECK(failed.load() == 4);
}

// CUDA broadcast across nodes: the root's pieces out, the host broadcast,
// the pieces back on the others; every rank ends with the root's bytes, the
// root's buffer untouched, and only the root copies out (only the others in).
TEST(staged_rounds_broadcast_moves_the_roots_bytes) {
  MemoryFabric fabric({2, 1, 1});
  std::string error = fabric.run([&](int r, Comm& c) {
    int variant = 0;
    for (size_t bytes : {size_t{1}, size_t{1000}, size_t{100003}})
      for (size_t round : {size_t{64}, size_t{4096}, size_t{1} << 20})
        for (int root : {0, 3}) {
          std::vector<char> buf(bytes), want(bytes);
          for (size_t i = 0; i < bytes; ++i) {
            // No period a round's size divides: a piece landing in another's place shows.
            buf[i] = static_cast<char>(((i * 2654435761u) >> 11) + static_cast<size_t>(r) * 13);
            want[i] = static_cast<char>(((i * 2654435761u) >> 11) + static_cast<size_t>(root) * 13);
          }
          HostStageDevice device(modeOf(variant++));
          StagedRoundsJob job = broadcastRounds(
              c, {.buf = buf.data(), .bytes = bytes, .root = root, .roundBytes = round}, kTuning);
          std::vector<char> host(job.hostBytes());
          runStagedRounds(c.ctx, device, std::move(job), host.data());
          const std::string at = "bytes " + std::to_string(bytes) + " round " +
                                 std::to_string(round) + " root " + std::to_string(root);
          if (buf != want) throw std::runtime_error(at + ": not the root's bytes");
          const bool isRoot = r == root;
          if (device.bytesToHost() != (isRoot ? bytes : 0) ||
              device.bytesFromHost() != (isRoot ? 0 : bytes))
            throw std::runtime_error(at + ": wrong bytes across the device");
          if (host.size() > std::max<size_t>(round, 1) * kStagedRoundSlots)
            throw std::runtime_error(at + ": pins more than four rounds");
        }
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

TEST(staged_rounds_stuck_device_times_out_naming_it) {
  MemoryFabric fabric({1});
  std::string error = fabric.run([&](int, Comm& c) {
    c.ctx.deadline = Deadline::after(std::chrono::milliseconds(300));
    std::vector<float> buf(64);
    StuckStageDevice device;
    StagedRoundsJob job = chunkedAllreduce(c, buf.data(), 64, 16, 2);
    std::vector<char> host(job.hostBytes());
    try {
      runStagedRounds(c.ctx, device, std::move(job), host.data());
    } catch (const CommError& e) {
      std::string what = e.what();
      if (what.find("timed out waiting for the device (copy to host memory)") == std::string::npos)
        throw std::runtime_error("unexpected message: " + what);
      return;
    }
    throw std::runtime_error("a stuck device did not time out");
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

TEST(staged_rounds_wait_stops_when_the_group_is_aborted) {
  MemoryFabric fabric({1});
  std::string error = fabric.run([&](int, Comm& c) {
    std::atomic<bool> cancel{false};
    c.ctx.cancel = &cancel;
    std::vector<float> buf(64);
    StuckStageDevice device;
    StagedRoundsJob job = chunkedAllreduce(c, buf.data(), 64, 16, 2);
    std::vector<char> host(job.hostBytes());
    std::thread aborter([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      cancel = true;
    });
    std::string what;
    try {
      runStagedRounds(c.ctx, device, std::move(job), host.data());
    } catch (const CommError& e) { what = e.what(); }
    aborter.join();
    if (what.find("aborted") == std::string::npos)
      throw std::runtime_error("an abort did not stop the wait: '" + what + "'");
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

TEST(staged_rounds_copy_the_next_round_out_during_a_host_step) {
  // The pipeline: while round k's host step runs, round k+1's copy out has
  // landed already (its slot is free: four slots, so round k-3 is back).
  MemoryFabric fabric({1});
  std::string error = fabric.run([&](int, Comm& c) {
    for (Mode mode : {Mode::Immediate}) {
      const size_t chunk = 64, rounds = 8;
      std::vector<float> buf(chunk * rounds);
      for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<float>(i);
      StagedRoundsJob job;
      job.slotBytes = chunk * 4;
      job.slots = 4;
      std::vector<char> host(job.hostBytes());
      std::atomic<int> overlapped{0};
      for (size_t k = 0; k < rounds; ++k) {
        char* dev = reinterpret_cast<char*>(buf.data() + k * chunk);
        job.rounds.push_back({{{dev, 0, chunk * 4}},
                              [&, k](char*) {
                                if (k + 1 == rounds) return;
                                std::this_thread::sleep_for(std::chrono::milliseconds(20));
                                const char* next = host.data() + ((k + 1) % 4) * chunk * 4;
                                if (std::memcmp(next, buf.data() + (k + 1) * chunk, chunk * 4) == 0)
                                  ++overlapped;
                              },
                              {{dev, 0, chunk * 4}}});
      }
      HostStageDevice device(mode);
      runStagedRounds(c.ctx, device, std::move(job), host.data());
      if (overlapped.load() != static_cast<int>(rounds) - 1)
        throw std::runtime_error(std::string("mode ") + std::to_string(static_cast<int>(mode)) +
                                 ": the next round's copy out landed during " +
                                 std::to_string(overlapped.load()) + " of " +
                                 std::to_string(rounds - 1) + " host steps");
    }
  });
  if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
  CHECK(error.empty());
}

// An int8 group's step across nodes (the CUDA paths stage each rank's share
// over the ranks of its local index, a Comm without the group's levels):
// the staged allreduce and reduce-scatter run the int8 wire's exchange on
// the host (int8Across*), with its bits, not float32; on a whole group of
// one rank per node the staged allreduce has the host int8 allreduce's bits.
TEST(staged_rounds_int8_across_nodes_runs_the_int8_wire) {
  for (const std::vector<int>& nodes : {std::vector<int>{2, 2}, {1, 1, 1}}) {
    MemoryFabric fabric(nodes);
    const bool whole = nodes[0] == 1;
    std::string error = fabric.run([&](int r, Comm& c) {
      c.int8 = true;
      Comm across = whole ? c : c.sub(c.levels->acrossNodes(c.levels->myLocal));
      if (!across.int8Across(DType::F32, RedOp::Sum))
        throw std::runtime_error("not int8 across nodes");
      for (size_t n : {size_t{1000}, size_t{70000}}) {
        const size_t chunk = 16384;
        std::vector<float> buf = valuesOf(r, n), ref = buf, plain = buf;
        std::vector<char> scratch;
        for (size_t at = 0; at < n; at += chunk) {
          const CollectiveArgs a{.buf = reinterpret_cast<char*>(ref.data() + at),
                                 .count = std::min(chunk, n - at),
                                 .dt = DType::F32,
                                 .op = RedOp::Sum};
          if (whole) allreduce(across, a, kTuning);
          else int8AcrossAllreduce(across, a, {.scratch = scratch});
        }
        Comm full = across;
        full.int8 = false;
        hostAllreduceByChunk(full, plain, chunk);
        HostStageDevice device(Mode::Deferred);
        runStagedAllreduce(across, device, buf, chunk);
        if (buf != ref)
          throw std::runtime_error("staged allreduce differs from the int8 exchange's");
        if (buf == plain)
          throw std::runtime_error("staged allreduce is float32's: int8 did not run");
        // Across PCIe: out, the others' pieces quantized and this rank's
        // float32; back, every piece quantized.
        size_t out = 0, back = 0;
        for (size_t at = 0; at < n; at += chunk) {
          const Blocks pieces = Blocks::even(std::min(chunk, n - at), across.size(), 1);
          for (int j = 0; j < across.size(); ++j) {
            out += j == across.rank() ? pieces.length[j] * 4 : int8Bytes(pieces.length[j]);
            back += int8Bytes(pieces.length[j]);
          }
        }
        if (device.bytesToHost() != out || device.bytesFromHost() != back || back > n * 4 / 3)
          throw std::runtime_error(
              "bytes across the device: " + std::to_string(device.bytesToHost()) + " out, " +
              std::to_string(device.bytesFromHost()) + " back");
      }
      {
        // Pieces under 8 values are not packed: float32 crosses the
        // device, and the host still runs the int8 exchange on it.
        std::vector<float> buf = valuesOf(r + 40, 10), ref = buf;
        std::vector<char> scratch;
        const CollectiveArgs a{.buf = reinterpret_cast<char*>(ref.data()),
                               .count = ref.size(),
                               .dt = DType::F32,
                               .op = RedOp::Sum};
        if (whole) allreduce(across, a, kTuning);
        else int8AcrossAllreduce(across, a, {.scratch = scratch});
        HostStageDevice device;
        runStagedAllreduce(across, device, buf, 16384);
        if (buf != ref)
          throw std::runtime_error("an unpacked int8 round differs from the exchange's");
        if (device.bytesToHost() != 40 || device.bytesFromHost() != 40)
          throw std::runtime_error("an unpacked int8 round did not stage float32");
      }
      if (whole) return;
      // Reduce-scatter over the pair: each keeps its block, the other's quantized once.
      const size_t each = 3000;
      std::vector<float> in = valuesOf(r + 20, each * 2), out(each), ref = in;
      std::vector<char> scratch;
      Blocks blocks = Blocks::equal(2, each * 4);
      int8AcrossReduceScatter(across,
                              {.buf = reinterpret_cast<char*>(ref.data()), .blocks = &blocks},
                              {.scratch = scratch});
      HostStageDevice device;
      runStagedReduceScatter(across, device, in, out, each);
      if (device.bytesToHost() != int8Bytes(each) + each * 4 || device.bytesFromHost() != each * 4)
        throw std::runtime_error("reduce-scatter's bytes across the device");
      const float* mine = ref.data() + each * static_cast<size_t>(across.rank());
      if (!std::equal(out.begin(), out.end(), mine))
        throw std::runtime_error("staged reduce-scatter differs from the int8 exchange's");
    });
    if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
    CHECK(error.empty());
  }
}

namespace {

// The layouts the feedback tests stage over, on an int8 group: the step
// across nodes of 2x2 (the ranks of one local index), and the whole group
// of 1x1x1 and of 2x2. Runs body(rank, comm) on every rank of each.
template <typename Body>
void forEachFeedbackLayout(Body body) {
  struct Case {
    std::vector<int> nodes;
    bool across;
  };
  for (const Case& k : {Case{{2, 2}, true}, Case{{1, 1, 1}, false}, Case{{2, 2}, false}}) {
    MemoryFabric fabric(k.nodes);
    std::string error = fabric.run([&](int r, Comm& c) {
      c.int8 = true;
      Comm comm = k.across ? c.sub(c.levels->acrossNodes(c.levels->myLocal)) : c;
      body(r, comm);
    });
    if (!error.empty()) std::fprintf(stderr, "  %s\n", error.c_str());
    CHECK(error.empty());
  }
}

}  // namespace

// The int8 wire's error feedback on the staged path (the CUDA paths' step
// across nodes, and the whole tensor staged where ranks share nodes): the
// rounds stage float32 and the host quantizes with the tensor's residuals
// from the round's first element on. Over three steps, on elements
// [first, first + m) of a tensor: the results and every residual equal
// the host int8 path's run chunk by chunk with the residuals at those
// offsets; the feedback ran (residuals set, results unlike those without
// feedback) and touched no element outside the range.
TEST(staged_rounds_carry_the_int8_error_feedback) {
  forEachFeedbackLayout([](int r, Comm& comm) {
    const size_t first = 3000, m = 17000, total = first + m + 500, chunk = 4096;
    Int8Residuals staged, host;
    staged.fit(total, true);
    host.fit(total, true);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> buf = valuesOf(r + 7 * step, m), ref = buf, unfed = buf;
      std::vector<char> scratch;
      for (size_t at = 0; at < m; at += chunk) {
        Comm part = comm;
        part.int8Feedback = {&host, first + at};
        const CollectiveArgs a{.buf = reinterpret_cast<char*>(ref.data() + at),
                               .count = std::min(chunk, m - at),
                               .dt = DType::F32,
                               .op = RedOp::Sum};
        if (part.int8Across(DType::F32, RedOp::Sum))
          int8AcrossAllreduce(part, a, {.scratch = scratch, .feedback = part.int8Feedback});
        else allreduce(part, a, kTuning);
      }
      Comm fed = comm;
      fed.int8Feedback = {&staged, first};
      HostStageDevice device;
      runStagedAllreduce(fed, device, buf, chunk);
      HostStageDevice plain;
      runStagedAllreduce(comm, plain, unfed, chunk);
      if (buf != ref) throw std::runtime_error("step " + std::to_string(step) + ": results differ");
      if (staged.sent != host.sent || staged.owned != host.owned)
        throw std::runtime_error("step " + std::to_string(step) + ": residuals differ");
      if (step > 0 && buf == unfed) throw std::runtime_error("the feedback changed nothing");
      if (device.bytesToHost() != m * 4 || device.bytesFromHost() != m * 4)
        throw std::runtime_error("a fed round did not stage float32");
    }
    auto touched = [&](const std::vector<float>& v, size_t b, size_t e) {
      return std::any_of(v.begin() + b, v.begin() + e, [](float x) { return x != 0.0f; });
    };
    if (!touched(staged.sent, first, first + m) || !touched(staged.owned, first, first + m))
      throw std::runtime_error("no residual was kept");
    for (const std::vector<float>* v : {&staged.sent, &staged.owned})
      if (touched(*v, 0, first) || touched(*v, first + m, total))
        throw std::runtime_error("residuals outside the staged elements changed");
  });
}

// The same for the staged reduce-scatter (FSDP2's gradients on CUDA
// tensors, keyed by module): float32 staged, the host quantizes the other
// ranks' blocks with the residuals of the staged input's elements; over
// three steps the results and residuals equal the host int8 path's, and
// the feedback changed the results.
TEST(staged_reduce_scatter_carries_the_int8_error_feedback) {
  forEachFeedbackLayout([](int r, Comm& comm) {
    const size_t each = 3000, p = static_cast<size_t>(comm.size());
    Int8Residuals staged, host;
    staged.fit(p * each, false);
    host.fit(p * each, false);
    const Blocks blocks = Blocks::equal(comm.size(), each * 4);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> in = valuesOf(r + 7 * step, p * each), ref = in, out(each), unfed(each);
      Comm part = comm;
      part.int8Feedback = {&host};
      std::vector<char> scratch;
      if (part.int8Across(DType::F32, RedOp::Sum))
        int8AcrossReduceScatter(part,
                                {.buf = reinterpret_cast<char*>(ref.data()), .blocks = &blocks},
                                {.scratch = scratch, .feedback = part.int8Feedback});
      else
        reduceScatter(part,
                      {.buf = reinterpret_cast<char*>(ref.data()),
                       .dt = DType::F32,
                       .op = RedOp::Sum,
                       .blocks = &blocks},
                      kTuning);
      Comm fed = comm;
      fed.int8Feedback = {&staged};
      HostStageDevice device;
      runStagedReduceScatter(fed, device, in, out, each);
      HostStageDevice plain;
      runStagedReduceScatter(comm, plain, in, unfed, each);
      const float* mine = ref.data() + each * static_cast<size_t>(comm.rank());
      if (!std::equal(out.begin(), out.end(), mine))
        throw std::runtime_error("step " + std::to_string(step) + ": results differ");
      if (staged.sent != host.sent || staged.owned != host.owned)
        throw std::runtime_error("step " + std::to_string(step) + ": residuals differ");
      if (step > 0 && out == unfed) throw std::runtime_error("the feedback changed nothing");
      if (device.bytesToHost() != p * each * 4 || device.bytesFromHost() != each * 4)
        throw std::runtime_error("a fed reduce-scatter did not stage float32");
    }
    if (std::all_of(staged.sent.begin(), staged.sent.end(), [](float x) { return x == 0.0f; }))
      throw std::runtime_error("no residual was kept");
  });
}
