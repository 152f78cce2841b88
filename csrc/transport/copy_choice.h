#pragma once
// How a shared-memory link copies a message into the ring that another
// process reads: plainly, or streamed past the caches
// (kernels/cpu/stream_copy.h). Where the two processes share a cache,
// plain is faster: the reader takes the lines from there, and a streamed
// piece must come back from memory (1.1-2.2x slower end to end, 2-rank
// collectives on the development VM: bench/results/cpu2-shm-copy-*).
// Where they do not (other cores or dies), a plain store
// first takes each line back from the reader's cache, where the last
// message left it, or the reader fetches each line from the writer's: then
// streamed is 3-7x faster. Which holds changes while the processes run (a
// scheduler or a VM's host moves them), so it is measured as it goes: the
// writer times its copies, the reader its reading, and the writer writes
// each way for a while to compare them, again every kRetryNs. An epoch of
// one way lasts three rings' worth: the first is not timed (after a change
// the ring's lines are where the other way left them: a plain copy then
// fetches them from memory first), and the reader has read the second by
// the time the writer ends the third.
#include <cstddef>
#include <cstdint>
#include <optional>

namespace smdccl {

enum class CopyWay : uint8_t { Plain = 0, Streamed = 1 };

// A running mean of a cost per byte. A sample over 4x the mean counts as
// 4x: one preemption in the middle of a copy does not turn a choice.
class RunningCost {
 public:
  // `bytes` (> 0) took `ns`.
  void add(int64_t ns, size_t bytes);
  double value() const { return v_; }  // 0 until the first sample

 private:
  double v_ = 0;
};

// The writer's half: which way to copy, from its own costs and the reader's.
class CopyChoice {
 public:
  // Auto as above; Plain / Streamed: always that way (SMDCCL_SHM_COPY).
  enum class Mode { Auto, Plain, Streamed };
  // Pieces this large are timed on both sides and may be streamed; smaller
  // ones are copied plainly (a way is only kept where it is measured).
  static constexpr size_t kTimedFrom = 64 << 10;
  static constexpr double kStreamAbove = 2.5;     // plain's cost over streamed's
  static constexpr int64_t kRetryNs = 100'000'000;

  CopyChoice(Mode mode, size_t ringBytes) : mode_(mode), ringBytes_(ringBytes) {}
  static Mode modeFromEnv();

  // Whether a copy of `bytes` is timed, and its reading too (auto); the writer
  // then records it at ring position `pos` (recordCopy), past the first
  // ring's worth of its epoch.
  bool timed(size_t bytes) const { return mode_ == Mode::Auto && bytes >= kTimedFrom; }
  bool settled(uint64_t pos) const { return pos - from_ >= ringBytes_; }
  // Before a timed copy at ring position `pos`, at `nowNs` (steady clock):
  // may change the way from `pos` on (see wayWord()).
  void advance(uint64_t pos, int64_t nowNs);
  // The way to copy a piece of `bytes` now.
  CopyWay wayFor(size_t bytes) const;
  void recordCopy(CopyWay way, size_t bytes, int64_t ns);
  // The reader's running cost of reading bytes written `way` (0: none yet).
  void setReadCost(CopyWay way, double nsPerByte) { read_[index(way)] = nsPerByte; }

  // The way that costs less, copy and reading together.
  CopyWay preferred() const;
  // Copy plus reading, ns per byte; 0 until both are measured.
  double cost(CopyWay way) const;
  // The way copies take from the epoch's first position on, as one word
  // for the reader: position << 1 | way. The ring holds bytes of at most
  // one earlier epoch (an epoch lasts over a ring's worth), past its first
  // ring's worth, so settledWayAt() tells the way of any byte the reader
  // has not consumed yet, or nothing for the first ring's worth of the
  // epoch (not timed).
  uint64_t wayWord() const { return from_ << 1 | static_cast<uint64_t>(way_); }
  static std::optional<CopyWay> settledWayAt(uint64_t wayWord, uint64_t pos, size_t ringBytes);

 private:
  static int index(CopyWay w) { return static_cast<int>(w); }
  static CopyWay other(CopyWay w) {
    return w == CopyWay::Plain ? CopyWay::Streamed : CopyWay::Plain;
  }
  // The way the next epoch takes (the current one's way: no change).
  CopyWay wanted(int64_t nowNs) const;
  Mode mode_;
  size_t ringBytes_;
  RunningCost copy_[2];
  double read_[2] = {0, 0};
  CopyWay way_ = CopyWay::Plain;
  uint64_t from_ = 0;              // where way_ started
  int64_t startedNs_[2] = {0, 0};  // when each way last started
};

}  // namespace smdccl
