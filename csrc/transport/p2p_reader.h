#pragma once
// One send/recv connection's incoming messages, read without blocking (the
// send/recv loop polls many) from a byte source (a socket, or a ring in
// shared memory: p2p_shm_stream.h): a header, then its payload into the
// receiver's buffer, into a buffer of the reader's own, or drained. The
// reader's own buffer grows as bytes arrive (at most doubling, from
// kPayloadChunk), so a header that claims more than its sender sends costs
// at most about twice what was sent, never the claimed size.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/p2p_frame.h"

namespace smdccl {

constexpr size_t kPayloadChunk = size_t(4) << 20;

// Where a reader's bytes come from.
class P2PByteSource {
 public:
  virtual ~P2PByteSource() = default;
  // Copies up to `room` bytes to `at`; returns how many (0: none there
  // now). Throws CommError (PeerFailure) once the other end closed or
  // failed and nothing more is there.
  virtual size_t take(char* at, size_t room) = 0;
  // Before a turn's takes: notices of new bytes that come other than as
  // the bytes themselves are taken now (a ring: its writer's wake-ups).
  virtual void startTurn() {}
  // After a turn's takes, which left `budget` unspent: whether to take on
  // at once, without waiting for the socket (a ring with bytes left).
  virtual bool readOnNow(uint64_t /*budget*/) { return false; }
};

// A connected socket's bytes, read without blocking; `peer` names the
// other end in errors ("rank 3").
class P2PSocketSource : public P2PByteSource {
 public:
  P2PSocketSource(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) {}
  size_t take(char* at, size_t room) override;

 private:
  int fd_;
  std::string peer_;
};

class P2PReader {
 public:
  // What read() stopped at.
  enum class Event {
    Idle,     // nothing more is there now (or the budget is spent)
    Header,   // a header is in: sinkTo() says where its payload goes
    Message,  // the message is in
  };
  enum class Sink {
    Into,    // the receiver's buffer, header().bytes long
    Buffer,  // the reader's own (a message nobody asked for yet, a report)
    Drain,   // nowhere: a message of the wrong size (only its size matters)
  };
  // Reads from `from`, at most `*budget` bytes (decremented). Throws what
  // the source throws, and CommError (Protocol) for a corrupt header.
  Event read(P2PByteSource& from, uint64_t* budget);
  const P2PHeader& header() const { return h_; }
  // After Event::Header. A message without payload is complete at once.
  void sinkTo(Sink sink, void* into = nullptr);
  bool complete() const { return stage_ != Stage::Header && got_ == h_.bytes; }
  // Into its own buffer, with more to come.
  bool buffering() const { return stage_ == Stage::Buffer && got_ < h_.bytes; }
  // While buffering: the rest goes to `sink` instead (Into: what is in the
  // buffer is copied to `into` first).
  void redirect(Sink sink, void* into = nullptr);
  // Sink::Buffer's bytes, once complete.
  std::vector<char> takeBuffer() { return std::move(buf_); }
  size_t bufferCapacity() const { return buf_.capacity(); }
  // Ready for the next message.
  void next();
  // Some of a message has arrived and the rest has not.
  bool midMessage() const { return stage_ != Stage::Header || headGot_ > 0; }

 private:
  enum class Stage { Header, Sinkless, Into, Buffer, Drain };
  // Where the next bytes go, and how many may go there.
  char* space(size_t* room);
  Stage stage_ = Stage::Header;
  uint8_t head_[sizeof(P2PHeader)];
  size_t headGot_ = 0;
  P2PHeader h_{};
  char* into_ = nullptr;
  std::vector<char> buf_;
  std::vector<char> sink_;  // Drain's bounded buffer
  uint64_t got_ = 0;        // payload bytes in
};

}  // namespace smdccl
