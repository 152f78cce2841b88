#pragma once
// One peer's outgoing side of send/recv, as the sending loop moves it: the
// send in flight (its header, its payload, how much has gone) and the path
// its bytes take, the connection itself or a shared-memory ring between
// ranks of one node (the sender chooses, and says so in the connection's
// first byte, P2PPath). The sending loop's alone; the queue of sends not
// started yet is the engine's, under its lock.
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "transport/p2p_frame.h"
#include "transport/p2p_requests.h"
#include "transport/p2p_shm_stream.h"

namespace smdccl {

class Mesh;

class P2POutChannel {
 public:
  using Clock = std::chrono::steady_clock;
  // A turn moves at most this many bytes, so that a large message does not
  // hold the other peers up.
  static constexpr uint64_t kTurnBytes = uint64_t(16) << 20;

  // `req` becomes the send in flight (none was).
  void start(P2PSend req);
  // Nothing in flight; the path stays.
  void clear();
  // Asks the send's `ready` (a GPU copy); once it answers true, or throws
  // (then the receiver gets why instead of the data), the header is made.
  void pollReady();
  // Moves what the path takes now, at most kTurnBytes, announcing the path
  // first (Mesh: to `rank` over `fd`); returns the bytes moved. Throws
  // CommError when the connection failed.
  uint64_t move(Mesh& mesh, int rank, int fd);
  // Every byte of the send in flight is out.
  bool finished() const { return sent == sizeof head + payloadBytes; }

  // The send in flight (also read by the engine's deadline and warning checks).
  bool active = false;
  bool ready = false;      // the data (or the report of why not) is there
  bool connected = false;  // polled on its peer's socket
  P2PSend req;
  std::exception_ptr notReady;  // why the data never came (sent as a report)
  uint64_t sent = 0;            // of the header and the payload
  uint64_t payloadBytes = 0;
  bool waitRoom = false;  // the shared-memory ring is full: wait for the reader's wake-up
  Clock::time_point lastMoved;
  bool warned = false;  // SMDCCL_WARN_AFTER: said once
  uint8_t head[sizeof(P2PHeader)];

 private:
  // The path's byte (false: the socket cannot take it now).
  bool announce(Mesh& mesh, int rank, int fd);
  uint64_t writeSocket(int rank, int fd);
  uint64_t writeRing();

  const char* payload_ = nullptr;
  std::string report_;  // kSenderFailed: why the data is not there
  bool announced_ = false;
  std::unique_ptr<P2PShmWriter> ring_;  // the path is shared memory
};

}  // namespace smdccl
