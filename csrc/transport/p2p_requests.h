#pragma once
// What a send or a receive of P2PEngine carries from its post to its
// completion: the caller's buffer, tag, deadline and completion.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>

#include "common/deadline.h"

namespace smdccl {

using Completion = std::function<void(std::exception_ptr)>;

// A message to send: `bytes` at `buf`, matched by `tag`, due by
// `deadline`; `done` runs once with its outcome. `ready`, when given, is
// polled by the loop before anything is sent: false while the data is not
// in `buf` yet (e.g. a GPU copy into it), true once it is; what it throws
// (or the deadline passing first) fails this send and the receive it
// matches (the receiver gets why), nothing else. `flags` go into the
// header (P2PHeader::kNonFinite: buf is a report).
struct P2PSend {
  const void* buf = nullptr;
  size_t bytes = 0;
  int64_t tag = 0;
  Deadline deadline;
  Completion done;
  std::function<bool()> ready = nullptr;
  uint32_t flags = 0;
};

// A posted receive: where a message of `tag` lands (`bytes` at `buf`), by
// `deadline`; `done` runs once with the outcome.
struct P2PRecv {
  using Clock = std::chrono::steady_clock;
  void* buf = nullptr;
  size_t bytes = 0;
  int64_t tag = 0;
  Deadline deadline = Deadline::never();
  Completion done;
  uint64_t posted = 0;              // post order over all receives
  std::function<void(int)> source;  // recvAny: told the sender's rank
  Clock::time_point postedAt = Clock::now();
  bool warned = false;  // SMDCCL_WARN_AFTER: said once
};

}  // namespace smdccl
