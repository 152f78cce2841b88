#pragma once
// One peer's incoming side of send/recv, as the receiving loop reads it:
// the path its bytes come by (the sender's first byte says: the connection
// itself, or a shared-memory ring), and the message being read with the
// receive it goes to. The receiving loop's alone; the receives posted and
// the messages kept for later are the engine's, under its lock.
#include <chrono>
#include <functional>
#include <memory>

#include "common/deadline.h"
#include "transport/p2p_reader.h"
#include "transport/p2p_requests.h"

namespace smdccl {

class Mesh;

class P2PInChannel {
 public:
  // What the engine does as a message comes in. A message must go on
  // arriving within `timeout()` of its first byte, and of its header (`due`).
  struct Events {
    const std::function<std::chrono::milliseconds()>* timeout;  // the group's, outlives the read
    std::function<void()> header;   // its header is in: it says where the payload goes
    std::function<void()> message;  // all of it is in
  };
  // Reads what is there (Mesh: from `rank` over `fd`), at most `budget`
  // bytes: the path's byte first, then messages. Throws CommError when the
  // connection failed or the path is unknown.
  void read(Mesh& mesh, int rank, int fd, uint64_t budget, const Events& on);

  P2PReader reader;
  bool matched = false;  // `target` is this message's receive
  P2PRecv target;
  Deadline due;         // the group's timeout from the message's first byte
  bool readNow = true;  // read without waiting for the socket (a ring with bytes left)

 private:
  // The path's byte, once it is in (false: not yet).
  bool learnPath(Mesh& mesh, int rank, int fd);
  std::unique_ptr<P2PByteSource> source_;  // once the path's byte is in
};

}  // namespace smdccl
