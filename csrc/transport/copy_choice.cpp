#include "transport/copy_choice.h"

#include <algorithm>
#include <string>

#include "common/env.h"

namespace smdccl {

SMDCCL_ENV_CHOICE(kShmCopy, "SMDCCL_SHM_COPY", "auto", "auto, plain, streamed",
                  "How a rank copies a message into the shared-memory ring that another local "
                  "rank reads: auto (measured as it goes, copy and reading together: streamed "
                  "past the caches where plain costs over 2.5x as much, e.g. ranks on cores "
                  "that share no cache), plain, or streamed (non-temporal stores on x86-64). "
                  "Pieces under 64 KiB are copied plainly. Set it alike on a node's ranks: "
                  "auto needs the reading rank's timings, which a rank on plain or streamed "
                  "does not take, so its writers stay plain.");

void RunningCost::add(int64_t ns, size_t bytes) {
  const double sample = static_cast<double>(std::max<int64_t>(ns, 1)) / static_cast<double>(bytes);
  v_ = v_ == 0 ? sample : v_ + (std::min(sample, 4 * v_) - v_) / 4;
}

CopyChoice::Mode CopyChoice::modeFromEnv() {
  const std::string v = envChoice(kShmCopy);
  if (v == "plain") return Mode::Plain;
  if (v == "streamed") return Mode::Streamed;
  return Mode::Auto;
}

double CopyChoice::cost(CopyWay way) const {
  const double c = copy_[index(way)].value(), r = read_[index(way)];
  return c > 0 && r > 0 ? c + r : 0;
}

CopyWay CopyChoice::preferred() const {
  const double plain = cost(CopyWay::Plain), streamed = cost(CopyWay::Streamed);
  return plain > 0 && streamed > 0 && plain > kStreamAbove * streamed ? CopyWay::Streamed
                                                                      : CopyWay::Plain;
}

CopyWay CopyChoice::wanted(int64_t nowNs) const {
  // Each way measured once first, plain first.
  if (cost(CopyWay::Plain) == 0) return CopyWay::Plain;
  if (cost(CopyWay::Streamed) == 0) return CopyWay::Streamed;
  const CopyWay best = preferred();
  if (way_ != best) return best;  // an epoch of the other way is over
  return nowNs - startedNs_[index(other(best))] >= kRetryNs ? other(best) : best;
}

void CopyChoice::advance(uint64_t pos, int64_t nowNs) {
  if (mode_ != Mode::Auto || pos - from_ < 3 * ringBytes_) return;
  const CopyWay want = wanted(nowNs);
  if (want == way_) return;
  way_ = want;
  from_ = pos;
  startedNs_[index(want)] = nowNs;
}

CopyWay CopyChoice::wayFor(size_t bytes) const {
  if (mode_ == Mode::Plain || bytes < kTimedFrom) return CopyWay::Plain;
  return mode_ == Mode::Streamed ? CopyWay::Streamed : way_;
}

void CopyChoice::recordCopy(CopyWay way, size_t bytes, int64_t ns) {
  copy_[index(way)].add(ns, bytes);
}

std::optional<CopyWay> CopyChoice::settledWayAt(uint64_t wayWord, uint64_t pos, size_t ringBytes) {
  const CopyWay since = static_cast<CopyWay>(wayWord & 1);
  const uint64_t from = wayWord >> 1;
  if (pos < from) return other(since);
  if (pos - from < ringBytes) return std::nullopt;
  return since;
}

}  // namespace smdccl
