#include "transport/shm_node.h"

#include <cstdint>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/error.h"
#include "common/log.h"
#include "common/steady_clock.h"
#include "kernels/cpu/stream_copy.h"

namespace smdccl {

namespace {
constexpr size_t kAlign = 16;            // every message starts 16-byte aligned
constexpr size_t kMaxPiece = 128 << 10;  // bytes per call: keeps both directions moving, in cache
size_t roundUp(size_t x, size_t a) { return (x + a - 1) / a * a; }
}  // namespace

size_t ShmNode::layOut(size_t ringBytes, size_t streamBytes) {
  size_t L = localRanks_.size();
  ringBytes_ = ringBytes;
  streamBytes_ = streamBytes;
  streamDataOffset_ = dataOffset_ + L * L * ringBytes_;
  return streamDataOffset_ + L * L * streamBytes_;
}

ShmNode::ShmNode(KVStore& store, const Members& m, Deadline deadline)
    : localRanks_(m.localRanks), ringBytes_(roundUp(std::max<size_t>(m.ringBytes, 4096), 4096)) {
  const std::string& groupToken = m.groupToken;
  me_ = localIndex(m.myRank);
  size_t L = localRanks_.size();
  ctlOffset_ = 128;
  hdrOffset_ = ctlOffset_ + L * sizeof(ShmRankCtl);
  streamHdrOffset_ = hdrOffset_ + L * L * sizeof(ShmRingHeader);
  dataOffset_ = roundUp(streamHdrOffset_ + L * L * sizeof(ShmStreamHeader), 4096);

  int leader = localRanks_[0];
  std::string name = strCat("/smdccl-", groupToken.substr(0, 16), "-n", leader);
  std::string key = strCat("smdccl/shm/", leader);
  // The leader sizes the rings to what /dev/shm can hold (Docker's default
  // is 64 MiB: 8 ranks' 1 MiB rings fill it) and publishes "ring
  // send/recv-ring name", or why it could not create the segment ('!'
  // first): the node's other ranks then use its sizes, or fail at once with
  // its reason instead of waiting for the group timeout. Pages are touched
  // only as rings are used, but a segment larger than /dev/shm would SIGBUS
  // once they are.
  size_t total = 0;
  if (m.myRank == leader) {
    size_t asked = ringBytes_;
    const size_t minRing = std::min<size_t>(asked, size_t(64) << 10);
    auto half = [&](size_t bytes) { return std::max(minRing, roundUp(bytes / 2, 4096)); };
    uint64_t freeBytes = ShmSegment::freeBytes();
    total = layOut(asked, asked);
    // The send/recv rings give way first, down to none (send/recv then
    // goes over TCP): the collectives move most bytes, and need their rings.
    while (total > freeBytes && (streamBytes_ > 0 || ringBytes_ > minRing))
      total = streamBytes_ > 0 ? layOut(ringBytes_, streamBytes_ > minRing ? half(streamBytes_) : 0)
                               : layOut(half(ringBytes_), 0);
    if (ringBytes_ != asked || streamBytes_ != asked)
      SMDCCL_WARN(
          "/dev/shm has ", freeBytes >> 20, " MiB free: this node's ", L * L,
          " shared-memory rings get ", ringBytes_ >> 10, " KiB each instead of ", asked >> 10,
          " (SMDCCL_SHM_RING_KB), send/recv ",
          streamBytes_ ? strCat(streamBytes_ >> 10, " KiB rings") : std::string("goes over TCP"),
          "; enlarge /dev/shm (e.g. docker run --shm-size=1g) for full bandwidth");
    ShmSegment::unlink(
        name);  // a stale one from a crashed job with the same token: impossible, but harmless
    try {
      segment_ = ShmSegment::create(name, total);
    } catch (const std::exception& e) {
      store.set(key, strCat("!", e.what()));
      throw;
    }
    store.set(key, strCat(ringBytes_, " ", streamBytes_, " ", name));
  } else {
    std::string published = store.get(key, deadline);
    if (!published.empty() && published[0] == '!')
      throw CommError(CommError::Kind::System,
                      strCat("rank ", leader, ", which creates this node's shared memory, failed: ",
                             published.substr(1)));
    size_t ring = 0, stream = 0;
    char named[256] = {};
    if (std::sscanf(published.c_str(), "%zu %zu %255s", &ring, &stream, named) != 3)
      throw CommError(CommError::Kind::Protocol,
                      strCat("bad shared-memory record '", published, "'"));
    total = layOut(ring, stream);
    name = named;
    segment_ = ShmSegment::open(name, total);
  }
  ctl(me_)->pid = static_cast<int32_t>(getpid());
  // Once every local rank has mapped it, the name is no longer needed.
  storeBarrier(store, key + "/mapped", static_cast<int>(L), deadline);
  ShmSegment::unlink(name);
  SMDCCL_INFO("shared memory ", name, ": ", L, " local ranks, ", ringBytes_ >> 10,
              " KiB rings (send/recv: ", streamBytes_ >> 10, " KiB), ", total >> 20, " MiB mapped");
}

int ShmNode::localIndex(int groupRank) const {
  auto it = std::find(localRanks_.begin(), localRanks_.end(), groupRank);
  if (it == localRanks_.end())
    throw std::logic_error(strCat("rank ", groupRank, " is not on this node"));
  return static_cast<int>(it - localRanks_.begin());
}

ShmRankCtl* ShmNode::ctl(int i) const {
  return reinterpret_cast<ShmRankCtl*>(segment_.data() + ctlOffset_) + i;
}

ShmRingHeader* ShmNode::ringHeader(int from, int to) const {
  return reinterpret_cast<ShmRingHeader*>(segment_.data() + hdrOffset_) +
         (from * localRanks_.size() + to);
}

char* ShmNode::ringData(int from, int to) const {
  return segment_.data() + dataOffset_ + (from * localRanks_.size() + to) * ringBytes_;
}

ShmStreamHeader* ShmNode::streamHeader(int from, int to) const {
  return reinterpret_cast<ShmStreamHeader*>(segment_.data() + streamHdrOffset_) +
         (from * localRanks_.size() + to);
}

char* ShmNode::streamData(int from, int to) const {
  return segment_.data() + streamDataOffset_ + (from * localRanks_.size() + to) * streamBytes_;
}

std::string ShmNode::peerGone(int groupRank) const {
  int i = localIndex(groupRank);
  if (ctl(i)->failed.load(std::memory_order_acquire))
    return strCat("rank ", groupRank, " (same node) stopped: a collective failed there");
  int32_t pid = ctl(i)->pid;
  if (!processAlive(pid))
    return strCat("rank ", groupRank, " (pid ", pid, ", same node) has exited");
  return "";
}

void ShmNode::checkAllAlive() const {
  for (size_t i = 0; i < localRanks_.size(); ++i) {
    if (static_cast<int>(i) == me_) continue;
    std::string why = peerGone(localRanks_[i]);
    if (!why.empty()) throw CommError(CommError::Kind::PeerFailure, why);
  }
}

void ShmNode::markFailed() {
  ctl(me_)->failed.store(1, std::memory_order_release);
  for (size_t i = 0; i < localRanks_.size(); ++i)
    if (static_cast<int>(i) != me_) ctl(static_cast<int>(i))->bell.ring();
}

ShmLink::ShmLink(std::shared_ptr<ShmNode> node, int myRank, int peerRank)
    : node_(std::move(node)), peer_(peerRank) {
  int me = node_->localIndex(myRank);
  int p = node_->localIndex(peerRank);
  out_ = node_->ringHeader(me, p);
  in_ = node_->ringHeader(p, me);
  outData_ = node_->ringData(me, p);
  inData_ = node_->ringData(p, me);
  peerBell_ = &node_->ctl(p)->bell;
  cap_ = node_->ringBytes();
  copyChoice_ = CopyChoice(CopyChoice::modeFromEnv(), cap_);
}

ShmLink::ShmLink(int peerRank, const Rings& rings)
    : peer_(peerRank),
      out_(rings.out),
      in_(rings.in),
      outData_(rings.outData),
      inData_(rings.inData),
      peerBell_(rings.peerBell),
      cap_(rings.ringBytes),
      copyChoice_(CopyChoice::modeFromEnv(), cap_) {}

size_t ShmLink::writable(char** at) {
  uint64_t tail = out_->tail.value.load(std::memory_order_acquire);
  // endSend() pads without waiting for room: a message that ends with the
  // ring full leaves sendPos_ up to kAlign - 1 bytes past tail + cap_, where
  // cap_ - used would wrap round to a huge space over unread bytes. Wait for
  // the reader to pass the padding.
  const uint64_t used = sendPos_ - tail;
  if (used >= cap_) return 0;
  size_t space = cap_ - static_cast<size_t>(used);
  size_t off = sendPos_ % cap_;
  *at = outData_ + off;
  return std::min({space, cap_ - off, kMaxPiece});
}

void ShmLink::commit(size_t k) {
  sendPos_ += k;
  out_->head.value.store(sendPos_, std::memory_order_release);
  if (peerBell_) peerBell_->ring();
}

size_t ShmLink::send(const void* buf, size_t n) {
  // Qualified: the ring's own helpers, without a virtual call per piece.
  char* at = nullptr;
  size_t k = std::min(n, ShmLink::writable(&at));
  if (k == 0) return 0;
  copyIn(at, buf, k);
  ShmLink::commit(k);
  return k;
}

namespace {
double costAt(const ShmCounter& c) {
  return std::bit_cast<double>(c.value.load(std::memory_order_relaxed));
}
}  // namespace

void ShmLink::copyIn(char* at, const void* buf, size_t k) {
  const bool timed = copyChoice_.timed(k);
  const int64_t start = timed ? steadyNowNs() : 0;
  if (timed) chooseWay(start);
  const CopyWay way = copyChoice_.wayFor(k);
  if (way == CopyWay::Streamed) streamCopy(at, buf, k);
  else std::memcpy(at, buf, k);
  if (timed && copyChoice_.settled(sendPos_)) copyChoice_.recordCopy(way, k, steadyNowNs() - start);
}

void ShmLink::chooseWay(int64_t nowNs) {
  for (CopyWay w : {CopyWay::Plain, CopyWay::Streamed})
    copyChoice_.setReadCost(w, costAt(out_->readCost[static_cast<int>(w)]));
  const uint64_t word = copyChoice_.wayWord();
  copyChoice_.advance(sendPos_, nowNs);
  if (copyChoice_.wayWord() == word) return;
  // Before the bytes: commit()'s release publishes it with them.
  out_->copyWay.value.store(copyChoice_.wayWord(), std::memory_order_relaxed);
  SMDCCL_LOG(LogLevel::Trace, "shm ring to rank ", peer_, ": copies ",
             (copyChoice_.wayWord() & 1) ? "streamed" : "plain", " from byte ", sendPos_,
             " (ns per byte, copy + read: plain ", copyChoice_.cost(CopyWay::Plain), ", streamed ",
             copyChoice_.cost(CopyWay::Streamed), ")");
}

void ShmLink::recordRead(size_t k) {
  if (readStartNs_ == 0) return;
  const int64_t ns = steadyNowNs() - readStartNs_;
  readStartNs_ = 0;
  if (k < CopyChoice::kTimedFrom) return;
  const std::optional<CopyWay> w =
      CopyChoice::settledWayAt(in_->copyWay.value.load(std::memory_order_relaxed), recvPos_, cap_);
  if (!w) return;
  const int i = static_cast<int>(*w);
  readCost_[i].add(ns, k);
  in_->readCost[i].value.store(std::bit_cast<uint64_t>(readCost_[i].value()),
                               std::memory_order_relaxed);
}

size_t ShmLink::readable(const char** at) {
  uint64_t head = in_->head.value.load(std::memory_order_acquire);
  if (head <= recvPos_) return 0;  // also while the producer's padding is unpublished
  size_t off = recvPos_ % cap_;
  *at = inData_ + off;
  const size_t k = std::min({static_cast<size_t>(head - recvPos_), cap_ - off, kMaxPiece});
  readStartNs_ = copyChoice_.timed(k) ? steadyNowNs() : 0;
  return k;
}

void ShmLink::consume(size_t k) {
  recordRead(k);
  recvPos_ += k;
  in_->tail.value.store(recvPos_, std::memory_order_release);
  if (peerBell_) peerBell_->ring();
}

size_t ShmLink::recv(void* buf, size_t n) {
  const char* at = nullptr;
  size_t k = std::min(n, ShmLink::readable(&at));
  if (k == 0) return 0;
  std::memcpy(buf, at, k);
  ShmLink::consume(k);
  return k;
}

void ShmLink::endSend() { sendPos_ = roundUp(sendPos_, kAlign); }

void ShmLink::endRecv() { recvPos_ = roundUp(recvPos_, kAlign); }

bool processAlive(int32_t pid) {
  if (pid <= 0) return true;  // not yet published: cannot tell
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return errno == EACCES;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // Format: "pid (comm) S ...": the state follows the last ')'.
  const char* close = std::strrchr(buf, ')');
  if (close && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X')) return false;
  return true;
}

}  // namespace smdccl
