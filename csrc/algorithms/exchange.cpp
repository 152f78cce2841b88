#include "algorithms/exchange.h"

#include <cstdint>
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "algorithms/op_header.h"
#include "common/error.h"
#include "kernels/cpu/reduce.h"

namespace smdccl {

Exchange& Exchange::add(Transfer added) {
  Link& link = *added.link;
  const Kind kind = added.kind;
  const size_t bytes = added.bytes;
  int index = static_cast<int>(t_.size());
  LinkTail* tail = nullptr;
  for (auto& lt : tails_)
    if (lt.link == &link) tail = &lt;
  if (!tail) tail = &tails_.emplace_back(LinkTail{&link, -1, -1});
  int& last = kind == Kind::Send ? tail->lastSend : tail->lastRecv;
  added.prevOnLink = last;
  t_.push_back(std::move(added));
  Transfer& t = t_.back();
  // This op's first message on the link in this direction carries its header.
  if (ctx_.seq != 0) {
    ExchangeBook::Peer& p = book_->of(link.peer());
    uint64_t& stamped = kind == Kind::Send ? p.headerSentFor : p.headerRecvFor;
    if (stamped != ctx_.seq) {
      stamped = ctx_.seq;
      if (kind == Kind::Send) p.headerOut = encodeOpHeader(ctx_.sig, ctx_.seq, ctx_.rank, bytes);
      t.header = kind == Kind::Send ? p.headerOut.data() : p.headerIn.data();
      t.headerLeft = kOpHeaderBytes;
    }
  }
  last = index;
  return *this;
}

Exchange& Exchange::send(Link& link, const void* buf, size_t bytes, Deps deps, Wire wire) {
  return add({.link = &link,
              .kind = Kind::Send,
              .buf = const_cast<char*>(static_cast<const char*>(buf)),
              .bytes = bytes,
              .dtype = DType::F32,
              .deps = deps,
              .wire = wire});
}

Exchange& Exchange::recv(Link& link, void* buf, size_t bytes, Deps deps, Wire wire) {
  return add({.link = &link,
              .kind = Kind::Recv,
              .buf = static_cast<char*>(buf),
              .bytes = bytes,
              .dtype = DType::F32,
              .deps = deps,
              .wire = wire});
}

Exchange& Exchange::recvReduce(Link& link, void* buf, size_t bytes, const Combine& how, Deps deps) {
  return add({.link = &link,
              .kind = Kind::RecvReduce,
              .buf = static_cast<char*>(buf),
              .bytes = bytes,
              .from = static_cast<const char*>(how.from),
              .streamOut = how.streamOut && how.from && how.from != buf,
              .dtype = how.dtype,
              .op = how.op,
              .deps = deps,
              .wire = how.wire,
              .roundTo = how.roundTo});
}

int Exchange::join(int a, int b) {
  if (a < 0 || b < 0 || a == b) return a < 0 ? b : a;
  t_.push_back({.kind = Kind::Join, .deps = {a, -1}});
  t_.back().after2 = b;
  return static_cast<int>(t_.size()) - 1;
}

namespace {
constexpr size_t kWireStageElems = 32 << 10;  // 64 KiB of 16-bit values per transfer in flight
}

FromWire Exchange::wireCombine(const Transfer& t) {
  return {.wire = t.wire,
          .op = t.op,
          .roundTo = t.roundTo,
          .a = t.from ? reinterpret_cast<const float*>(t.from + t.done) : nullptr};
}

bool Exchange::moveWireSend(Transfer& t, size_t limit) {
  bool moved = false;
  if (t.link->inPlace()) {
    // Cast straight into the link's buffer: no staging copy.
    while (t.done + 4 <= limit) {
      char* at = nullptr;
      size_t k = std::min((limit - t.done) / 4, t.link->writable(&at) / 2);
      if (k == 0) break;
      packToWire(at, reinterpret_cast<const float*>(t.buf + t.done), k, t.wire);
      t.link->commit(k * 2);
      t.done += k * 4;
      moved = true;
    }
    return moved;
  }
  while (true) {
    if (t.stagedBytes == t.movedBytes) {
      // Everything packed has gone: pack the next run (whole float32 elements).
      size_t n = std::min((limit - t.done) / 4, kWireStageElems);
      if (n == 0) return moved;
      t.staging.resize(kWireStageElems);
      packToWire(t.staging.data(), reinterpret_cast<const float*>(t.buf + t.done), n, t.wire);
      t.stagedAt = t.done;
      t.stagedBytes = n * 2;
      t.movedBytes = 0;
    }
    size_t k = t.link->send(reinterpret_cast<char*>(t.staging.data()) + t.movedBytes,
                            t.stagedBytes - t.movedBytes);
    if (k == 0) return moved;
    moved = true;
    t.movedBytes += k;
    t.done = t.stagedAt + t.movedBytes / 2 * 4;  // only whole elements count as sent
  }
}

bool Exchange::moveWireRecv(Transfer& t, size_t limit) {
  bool moved = false;
  if (t.link->inPlace()) {
    // Unpack (and reduce) straight out of the link's buffer.
    while (t.done < limit) {
      const char* at = nullptr;
      size_t k = std::min((limit - t.done) / 4, t.link->readable(&at) / 2);
      if (k == 0) break;
      float* dst = reinterpret_cast<float*>(t.buf + t.done);
      if (t.kind == Kind::RecvReduce) reduceFromWire(dst, at, k, wireCombine(t));
      else unpackFromWire(dst, at, k, t.wire);
      t.link->consume(k * 2);
      t.done += k * 4;
      moved = true;
    }
    return moved;
  }
  t.staging.resize(kWireStageElems);
  char* stage = reinterpret_cast<char*>(t.staging.data());
  while (t.done < limit) {
    size_t want = std::min((limit - t.done) / 4, kWireStageElems) * 2;
    size_t k = t.link->recv(stage + t.movedBytes, want - t.movedBytes);
    if (k == 0) return moved;
    moved = true;
    t.movedBytes += k;
    size_t whole = t.movedBytes / 2;
    if (whole == 0) continue;
    float* dst = reinterpret_cast<float*>(t.buf + t.done);
    if (t.kind == Kind::RecvReduce) reduceFromWire(dst, stage, whole, wireCombine(t));
    else unpackFromWire(dst, stage, whole, t.wire);
    t.done += whole * 4;
    t.movedBytes -= whole * 2;
    if (t.movedBytes) std::memmove(stage, stage + whole * 2, t.movedBytes);
  }
  return moved;
}

static inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

bool Exchange::progressOnce(bool* allDone) {
  bool progressed = false;
  *allDone = true;
  while (firstOpen_ < t_.size() && t_[firstOpen_].finished) ++firstOpen_;
  for (size_t idx = firstOpen_; idx < t_.size(); ++idx) {
    Transfer& t = t_[idx];
    if (t.finished) continue;
    if (!depsDone(t)) {
      *allDone = false;
      continue;
    }
    if (t.kind == Kind::Join) {
      t.finished = true;
      progressed = true;
      continue;
    }
    try {
      if (move(t)) progressed = true;
    } catch (const CommError& e) {
      throw CommError(e.kind(), strCat("smdccl: ", ctx_.describe(), ": ", e.what()));
    }
    if (t.done == t.bytes && t.headerLeft == 0) {
      t.finished = true;
      std::vector<uint16_t>().swap(t.staging);
      if (t.kind == Kind::Send) {
        t.link->endSend();
        if (ctx_.sentBytes) *ctx_.sentBytes += t.wire == Wire::F32 ? t.bytes : t.bytes / 2;
      } else {
        t.link->endRecv();
      }
    } else {
      *allDone = false;
    }
  }
  return progressed;
}

void Exchange::run() {
  using Clock = std::chrono::steady_clock;
  // Zero-length transfers complete at once but still mark message ends.
  bool allDone = false;
  auto idleSince = Clock::now();
  auto lastHealth = idleSince;
  int polls = 0;
  while (true) {
    if (progressOnce(&allDone)) {
      if (allDone) break;
      idleSince = Clock::now();
      continue;
    }
    if (allDone) break;
    // Nothing moved: back off, gently at first. Without a spin budget (the
    // machine's cores are oversubscribed) a poll between yields is a recv
    // syscall on the core the awaited rank needs: yield, then sleep.
    if (ctx_.wait.spinUs > 0 && (++polls & 63) != 0) {
      cpuRelax();
      continue;
    }
    auto now = Clock::now();
    auto idleUs = std::chrono::duration_cast<std::chrono::microseconds>(now - idleSince).count();
    if (idleUs < ctx_.wait.spinUs) continue;
    if (now - lastHealth > std::chrono::milliseconds(100)) {
      checkHealth();
      lastHealth = now;
    }
    if (idleUs < ctx_.wait.spinUs + ctx_.wait.yieldUs) {
      sched_yield();
      continue;
    }
    sleepForProgress();
  }
  t_.clear();
  tails_.clear();
  firstOpen_ = 0;
}

bool Exchange::depsDone(const Transfer& t) const {
  return (t.deps.after < 0 || t_[t.deps.after].finished) &&
         (t.after2 < 0 || t_[t.after2].finished) && (t.prevOnLink < 0 || t_[t.prevOnLink].finished);
}

size_t Exchange::limitOf(const Transfer& t) const {
  return t.deps.limitBy < 0 ? t.bytes : std::min(t.bytes, t_[t.deps.limitBy].done);
}

bool Exchange::canMove(const Transfer& t) const {
  return !t.finished && depsDone(t) && (t.headerLeft > 0 || limitOf(t) > t.done);
}

bool Exchange::moveHeader(Transfer& t) {
  bool moved = false;
  while (t.headerLeft > 0) {
    unsigned char* at = t.header + (kOpHeaderBytes - t.headerLeft);
    size_t k =
        t.kind == Kind::Send ? t.link->send(at, t.headerLeft) : t.link->recv(at, t.headerLeft);
    if (k == 0) break;
    t.headerLeft -= k;
    moved = true;
  }
  if (moved && t.headerLeft == 0 && t.kind != Kind::Send) checkHeader(t);
  return moved;
}

void Exchange::checkHeader(const Transfer& t) const {
  std::string why =
      opMismatch(ctx_, decodeOpHeader(t.header), t.link->peer(), ctx_.compareShapes, t.bytes);
  if (!why.empty()) throw CommError(CommError::Kind::Mismatch, why);  // progressOnce() names the op
}

bool Exchange::move(Transfer& t) {
  if (t.headerLeft > 0) {
    bool moved = moveHeader(t);
    if (t.headerLeft > 0) return moved;
    return move(t) || moved;
  }
  if (t.wire == Wire::F32) return moveRaw(t, limitOf(t));
  return t.kind == Kind::Send ? moveWireSend(t, limitOf(t)) : moveWireRecv(t, limitOf(t));
}

bool Exchange::moveRaw(Transfer& t, size_t limit) {
  // Keep moving on this transfer while it makes progress: fewer trips
  // through the loop for large messages.
  bool moved = false;
  while (t.done < limit) {
    size_t left = limit - t.done;
    size_t k;
    switch (t.kind) {
      case Kind::Send: k = t.link->send(t.buf + t.done, left); break;
      case Kind::Recv: k = t.link->recv(t.buf + t.done, left); break;
      default:
        k = recvReduceSome(t, left);
        roundToWire(reinterpret_cast<float*>(t.buf + t.done), k / 4, t.roundTo);  // F32: no-op
        break;
    }
    if (k == 0) break;
    t.done += k;
    moved = true;
  }
  return moved;
}

namespace {
constexpr size_t kReduceStaging = 256 << 10;  // per peer, for links read through recv()
}

size_t Exchange::recvReduceSome(Transfer& t, size_t n) {
  const size_t es = elementSize(t.dtype);
  char* dst = t.buf + t.done;
  const char* first = t.from ? t.from + t.done : dst;
  if (t.link->inPlace()) {
    // Reduce straight out of the link's buffer: no copy.
    const char* at = nullptr;
    size_t k = std::min(n, t.link->readable(&at)) / es * es;
    if (k == 0) return 0;
    (t.streamOut ? reduceToStreaming : reduceTo)(dst, first, at, k / es, {t.dtype, t.op});
    t.link->consume(k);
    return k;
  }
  // Received into the peer's staging; bytes short of a whole element wait
  // there for the rest (also into the next transfer from that peer).
  ExchangeBook::Peer& p = book_->of(t.link->peer());
  if (p.reduceStaging.empty()) p.reduceStaging.resize(kReduceStaging);
  char* stage = p.reduceStaging.data();
  size_t want = std::min(n, kReduceStaging) - p.reduceStaged;
  p.reduceStaged += t.link->recv(stage + p.reduceStaged, want);
  size_t whole = p.reduceStaged / es * es;
  if (whole == 0) return 0;
  (t.streamOut ? reduceToStreaming : reduceTo)(dst, first, stage, whole / es, {t.dtype, t.op});
  p.reduceStaged -= whole;
  if (p.reduceStaged) std::memmove(stage, stage + whole, p.reduceStaged);
  return whole;
}

void Exchange::sleepForProgress() {
  // Only transfers that could move now decide how to sleep: a socket whose
  // transfer waits on a shared-memory one must not turn the futex sleep into
  // a poll() with short naps (each intra-node step would cost a nap).
  std::vector<pollfd> fds;
  bool anyShm = false;
  for (size_t i = firstOpen_; i < t_.size(); ++i) {
    const Transfer& t = t_[i];
    if (!canMove(t)) continue;
    int fd = t.link->pollFd();
    if (fd < 0) anyShm = true;
    else fds.push_back({fd, static_cast<short>(t.kind == Kind::Send ? POLLOUT : POLLIN), 0});
  }
  if (!fds.empty()) {
    // Shared-memory progress does not wake poll(): keep the nap short then.
    poll(fds.data(), fds.size(), anyShm ? 1 : 20);
    return;
  }
  if (!bell_) return;
  bell_->sleeping.store(1, std::memory_order_seq_cst);
  uint32_t seen = bell_->count.load(std::memory_order_seq_cst);
  bool allDone = false;
  // Re-check after arming: a peer that moved data before we armed rang the
  // bell already, so the futex would not sleep on the stale value anyway.
  if (!progressOnce(&allDone) && !allDone) futexWait(&bell_->count, seen, 20000);
  bell_->sleeping.store(0, std::memory_order_relaxed);
}

void Exchange::checkHealth() {
  if (ctx_.cancel && ctx_.cancel->load(std::memory_order_relaxed))
    throw CommError(CommError::Kind::System,
                    strCat("smdccl: ", ctx_.describe(), ": the group was aborted on this rank"));
  try {
    if (node_) node_->checkAllAlive();
  } catch (const CommError& e) {
    throw CommError(e.kind(), strCat("smdccl: ", ctx_.describe(), ": ", e.what()));
  }
  if (ctx_.deadline.expired()) timeout();
}

void Exchange::timeout() {
  // One entry per peer, direction and transport, in schedule order: a
  // pipelined collective has dozens of transfers per peer, and listing each
  // buried the rest of the message (the group's first failure) in repeats.
  struct Waiting {
    bool send;
    int peer;
    const char* kind;
    size_t done, bytes;
    int transfers;
  };
  std::vector<Waiting> open;
  for (auto& t : t_) {
    if (t.finished || !t.link) continue;
    bool send = t.kind == Kind::Send;
    auto same = [&](const Waiting& w) {
      return w.send == send && w.peer == t.link->peer() && std::strcmp(w.kind, t.link->kind()) == 0;
    };
    auto it = std::find_if(open.begin(), open.end(), same);
    if (it == open.end()) {
      open.push_back({send, t.link->peer(), t.link->kind(), t.done, t.bytes, 1});
    } else {
      it->done += t.done;
      it->bytes += t.bytes;
      ++it->transfers;
    }
  }
  std::string waiting;
  for (const auto& w : open)
    waiting += strCat(waiting.empty() ? "" : "; ", w.send ? "sending to" : "receiving from",
                      " rank ", w.peer, " (", w.done, " of ", w.bytes, " bytes",
                      w.transfers > 1 ? strCat(" in ", w.transfers, " transfers") : std::string(),
                      ", ", w.kind, ")");
  throw CommError(CommError::Kind::Timeout,
                  strCat("smdccl: ", ctx_.describe(), " timed out waiting: ", waiting,
                         ". Is that rank alive and did it call the same collective?"));
}

}  // namespace smdccl
