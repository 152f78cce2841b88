#pragma once
// How many SMs smdccl's kernels may fill. All of them by default; a cap
// (SMDCCL_CUDA_MAX_SMS) leaves the rest to the training's own kernels, so a
// collective's reductions overlap with the backward pass instead of queueing
// behind it or pushing it out (NCCL_MAX_CTAS in spirit). The kernels are
// elementwise with grid-stride loops: the cap changes their speed, never
// their results. No CUDA here: the arithmetic is unit-tested on the host.
#include <atomic>
#include <cstddef>

namespace smdccl::cuda {

// Process-wide; 0: no cap. Set from SMDCCL_CUDA_MAX_SMS when a group makes
// its GPU state.
inline std::atomic<int> gMaxSms{0};
inline void setMaxSms(int sms) { gMaxSms.store(sms < 0 ? 0 : sms, std::memory_order_relaxed); }
inline int maxSms() { return gMaxSms.load(std::memory_order_relaxed); }

// SMs a kernel may use on a device with `deviceSms`: all, or the cap if it
// is smaller; at least one.
inline int usableSms(int deviceSms, int cap) {
  int n = cap > 0 && cap < deviceSms ? cap : deviceSms;
  return n > 0 ? n : 1;
}

// Blocks to launch for `work` units, `perBlock` per block and pass: enough
// to cover the work, at most one full wave (`blocksPerSm` resident on each
// of `sms`), so grid-stride loops stay balanced; at least one.
inline size_t waveBlocks(size_t work, size_t perBlock, int sms, int blocksPerSm) {
  size_t need = perBlock ? (work + perBlock - 1) / perBlock : 1;
  size_t wave = static_cast<size_t>(sms > 0 ? sms : 1) *
                static_cast<size_t>(blocksPerSm > 0 ? blocksPerSm : 1);
  if (need > wave) need = wave;
  return need < 1 ? 1 : need;
}

}  // namespace smdccl::cuda
