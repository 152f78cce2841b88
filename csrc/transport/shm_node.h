#pragma once
// The shared-memory area of one node in one group: a doorbell and pid per
// local rank, and two single-producer/single-consumer byte rings for every
// ordered pair of local ranks: one for collectives, one for send/recv
// (p2p_shm_stream.h; the first to shrink, to none, when /dev/shm is small).
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/store.h"
#include "transport/copy_choice.h"
#include "transport/futex.h"
#include "transport/link.h"
#include "transport/shm_segment.h"

namespace smdccl {

struct alignas(128) ShmRankCtl {
  Doorbell bell;
  int32_t pid;
  // Set by its rank when a collective failed there: the group is unusable,
  // and local peers waiting on it must stop too (it is alive, so the pid
  // check would not tell them).
  std::atomic<int32_t> failed;
};

struct alignas(128) ShmCounter {
  std::atomic<uint64_t> value;
};

struct ShmRingHeader {
  ShmCounter head;  // bytes published by the producer (monotonic)
  ShmCounter tail;  // bytes released by the consumer (monotonic)
  // How the producer copies (CopyChoice::wayWord), and what the consumer's
  // reading costs for each way (a double's bits, ns per byte; 0: unknown).
  ShmCounter copyWay;
  ShmCounter readCost[2];
};

// A send/recv ring, and what each end asks of the other's next move: the
// reader found it empty and sleeps until told of more (wantsData), the
// writer found it full and sleeps until told of room (wantsRoom).
struct ShmStreamHeader {
  ShmRingHeader ring;
  ShmCounter wantsData;
  ShmCounter wantsRoom;
};

class ShmNode {
 public:
  // Who shares the segment: the group ranks in `localRanks` (all on this
  // node, `myRank` among them), each pair with rings of `ringBytes`.
  struct Members {
    std::string groupToken;  // the segment is named after it
    std::vector<int> localRanks;
    int myRank;
    size_t ringBytes;
  };
  // Collective over m.localRanks: creates or opens the segment, then unlinks it.
  ShmNode(KVStore& store, const Members& m, Deadline deadline);

  int localIndex(int groupRank) const;
  int myLocalIndex() const { return me_; }
  ShmRankCtl* ctl(int localIdx) const;
  ShmRingHeader* ringHeader(int from, int to) const;
  char* ringData(int from, int to) const;
  size_t ringBytes() const { return ringBytes_; }
  // The send/recv ring from local index `from` to `to` (streamBytes() 0:
  // there are none).
  ShmStreamHeader* streamHeader(int from, int to) const;
  char* streamData(int from, int to) const;
  size_t streamBytes() const { return streamBytes_; }
  Doorbell& myBell() const { return ctl(me_)->bell; }
  // Throws CommError naming the first local rank whose process is gone, or
  // that has given up after a failure (markFailed): a collective cannot
  // finish without it, whoever we are waiting on.
  void checkAllAlive() const;
  // Why local rank `groupRank` is gone (its process exited, or it gave up
  // after a failure), or "" while it is there.
  std::string peerGone(int groupRank) const;
  // After a failure on this rank: tells the local peers (checkAllAlive), and
  // wakes them.
  void markFailed();

 private:
  std::vector<int> localRanks_;
  int me_ = -1;
  // Sizes the segment's parts for collective rings of `ringBytes` and
  // send/recv rings of `streamBytes`; returns the segment's size.
  size_t layOut(size_t ringBytes, size_t streamBytes);
  size_t ringBytes_, streamBytes_ = 0;
  size_t ctlOffset_, hdrOffset_, streamHdrOffset_, dataOffset_, streamDataOffset_ = 0;
  ShmSegment segment_;
};

class ShmLink : public Link {
 public:
  ShmLink(std::shared_ptr<ShmNode> node, int myRank, int peerRank);
  // A ring pair in memory the caller owns and keeps alive (threads of one
  // process: the in-process algorithm tests).
  struct Rings {
    ShmRingHeader* out;
    ShmRingHeader* in;
    char* outData;
    char* inData;
    Doorbell* peerBell;  // rung at each commit and consume (nullptr: none)
    size_t ringBytes;
  };
  ShmLink(int peerRank, const Rings& rings);
  int peer() const override { return peer_; }
  size_t send(const void* buf, size_t n) override;
  size_t recv(void* buf, size_t n) override;
  bool inPlace() const override { return true; }
  // The ring itself: bytes contiguous at recvPos_ / free space at sendPos_.
  size_t readable(const char** at) override;
  void consume(size_t k) override;
  size_t writable(char** at) override;
  void commit(size_t k) override;
  void endSend() override;
  void endRecv() override;
  const char* kind() const override { return "shm"; }
  // Bytes in the incoming ring not consumed yet, and its size.
  uint64_t unread() const { return in_->head.value.load(std::memory_order_acquire) - recvPos_; }
  size_t capacity() const { return cap_; }

 private:
  std::shared_ptr<ShmNode> node_;
  int peer_;
  ShmRingHeader* out_;
  ShmRingHeader* in_;
  char* outData_;
  char* inData_;
  Doorbell* peerBell_;
  size_t cap_;
  uint64_t sendPos_ = 0;
  uint64_t recvPos_ = 0;
  // How this end copies into out_, and its reading of in_, timed for the
  // other end's choice (0: the bytes at recvPos_ are not timed).
  CopyChoice copyChoice_{CopyChoice::Mode::Plain, 0};
  RunningCost readCost_[2];
  int64_t readStartNs_ = 0;
  // Copies `k` bytes into the ring at `at` the way copyChoice_ says.
  void copyIn(char* at, const void* buf, size_t k);
  // Before a timed copy: the reader's costs in, a change of way out.
  void chooseWay(int64_t nowNs);
  // After consume(k) of timed bytes: their cost, for the writer.
  void recordRead(size_t k);
};

// True unless the process is gone or a zombie.
bool processAlive(int32_t pid);

}  // namespace smdccl
