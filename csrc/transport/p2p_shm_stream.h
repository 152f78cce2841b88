#pragma once
// One direction of send/recv between two ranks of one node: the messages'
// bytes go through a ring in the node's shared memory (ShmNode's send/recv
// rings), and the TCP connection the sender dialled carries only wake-ups:
// one byte when the writer adds to a ring its reader sleeps on, one byte
// back when the reader frees room its writer sleeps on. So the loops poll
// sockets alike for every peer, a closed connection still says the peer is
// gone, and a message costs two copies instead of the TCP stack.
//
// Each side asks for its wake-up in the ring's header (wantsData,
// wantsRoom) and then looks at the ring once more; the other side looks at
// the flag after each move. With sequentially consistent accesses on both
// sides one of the two sees the other's, so neither sleeps on bytes or
// room that are there, and no byte is written while both are busy.
#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/p2p_reader.h"
#include "transport/shm_node.h"

namespace smdccl {

// The sender's end. `fd` is its connection to the receiver; `peer` names
// the receiver in errors ("rank 3").
class P2PShmWriter {
 public:
  P2PShmWriter(const ShmNode& node, int myRank, int peerRank, int fd, std::string peer);
  // Copies what the ring has room for of `n` bytes at `data`; returns how
  // many (0: the ring is full, and the reader will wake this side's
  // connection when there is room). Throws CommError (PeerFailure) when
  // the connection failed.
  size_t write(const char* data, size_t n);
  // Takes the reader's wake-ups off the connection. Throws CommError
  // (PeerFailure) once the receiver closed it.
  void takeWakeUps();

 private:
  ShmLink ring_;
  ShmStreamHeader* hdr_;
  int fd_;
  std::string peer_;
};

// The receiver's end, the reader's byte source. `fd` is the sender's
// connection; `peer` names the sender in errors.
class P2PShmReader : public P2PByteSource {
 public:
  P2PShmReader(const ShmNode& node, int myRank, int peerRank, int fd, std::string peer);
  // From the ring; 0 while it is empty. Throws CommError (PeerFailure) once
  // the sender closed its connection and the ring is empty.
  size_t take(char* at, size_t room) override;
  // takeWakeUps(); and, after a turn, a ring left with bytes (a full
  // turn), or filled as sleepOn() asked for a wake-up, is read on at once.
  void startTurn() override { takeWakeUps(); }
  bool readOnNow(uint64_t budget) override { return budget == 0 || !sleepOn(); }
  // Takes the writer's wake-ups off the connection, and notes whether it
  // closed or failed (what is in the ring is still read: a writer that
  // finished may have exited).
  void takeWakeUps();
  // The ring was found empty: asks the writer for a wake-up. False when
  // bytes came meanwhile (read on; the wake-up comes anyway).
  bool sleepOn();

 private:
  ShmLink ring_;
  ShmStreamHeader* hdr_;
  int fd_;
  std::string peer_;
  bool closed_ = false;
};

}  // namespace smdccl
