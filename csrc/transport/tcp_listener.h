#pragma once
// One TCP listener per process, shared by every group. A connection is
// accepted only if it opens with a Hello carrying a registered group's random
// token and valid ranks; anything else is logged and dropped. Accepted
// sockets wait in the group's inbox until the group takes them.
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include "common/deadline.h"
#include "transport/socket_util.h"

namespace smdccl {

using GroupToken = std::array<uint8_t, 16>;

GroupToken randomToken();
std::string tokenToHex(const GroupToken& t);
GroupToken tokenFromHex(const std::string& hex);

// What a peer sends first on every connection (fixed size, little-endian).
struct Hello {
  static constexpr uint32_t kMagic = 0x43444d53;  // "SMDC"
  static constexpr uint16_t kVersion = 1;
  uint32_t magic;
  uint16_t version;
  uint16_t channel;  // which stream between the pair (collectives, p2p)
  int32_t srcRank;   // group ranks
  int32_t dstRank;
  GroupToken token;
};
static_assert(sizeof(Hello) == 32, "Hello is a wire format");

// Probe: a member asking whether this rank's process is still there (see
// listener_probe.h); the listener closes it once the Hello is read.
enum class Channel : uint16_t { Collective = 1, PointToPoint = 2, Probe = 3 };

// Handshake parsing, pure (no sockets, no state) so that the listener and the
// fuzz test (tests/cpp/test_frame_fuzz.cpp) run the same code.
//
// Decodes the Hello at the start of `data` (little-endian, exactly
// sizeof(Hello) bytes; what follows belongs to the stream, not the
// handshake). Rejects fewer bytes, or a wrong magic or version, with `why`
// set; never reads past data + len.
struct HelloParse {
  bool ok = false;
  const char* why = nullptr;  // the rejection, for the log; nullptr when ok
  Hello hello{};
};
HelloParse parseHello(const uint8_t* data, size_t len);
// The wire bytes of `h` (what connectToPeer sends).
void encodeHello(const Hello& h, uint8_t out[sizeof(Hello)]);

// The wire bytes of the Hello a group member sends.
std::array<uint8_t, sizeof(Hello)> memberHello(const GroupToken& token, int srcRank, int dstRank,
                                               Channel channel);

// What the listener knows of a registered group.
struct HelloGroup {
  int size;
  int myRank;
};
// Checks a decoded Hello against the group its token names (`group`, nullptr
// when no group has that token): nullptr if acceptable, else why not.
const char* checkHello(const Hello& h, const HelloGroup* group);

class TcpListener {
 public:
  // A connection must say Hello within this...
  static constexpr int kHandshakeMs = 5000;
  // ...and at most this many may be waiting to: when full, a new connection
  // pushes out the oldest waiting one (an idle flood must not lock real
  // peers out).
  static constexpr size_t kMaxPending = 256;

  // The process-wide listener, started on first use on `localIp`.
  static TcpListener& instance(const std::string& localIp);

  std::string address() const { return address_; }
  void registerGroup(const GroupToken& token, int groupSize, int myRank);
  void unregisterGroup(const GroupToken& token);
  // The group failed or was aborted on this rank: its connections not yet
  // taken are closed, later ones are closed at once (not counted as
  // rejected: the peer is a member), and take() raises. unregisterGroup()
  // still ends it.
  void closeGroup(const GroupToken& token);
  // Waits for the connection `srcRank` opens to us on `channel` (`gone`:
  // see connectTo).
  int take(const GroupToken& token, int srcRank, Channel channel, const SocketWait& w);
  // The same without waiting: the connection, or -1 while there is none.
  int tryTake(const GroupToken& token, int srcRank, Channel channel);
  // An eventfd that turns readable when a connection for the group arrives
  // (an event loop polls it; reading it is the poller's), -1 once the group
  // is unregistered.
  int arrivalFd(const GroupToken& token) const;
  // Counts connections dropped for a bad handshake (tests read it).
  uint64_t rejectedCount() const { return rejected_; }
  // A flood must not flood the log too: at most this many "dropped
  // connection" WARN lines per window; the rest are logged at INFO and
  // counted in one WARN line after it.
  static constexpr int kDropWarnBurst = 10;
  static constexpr int kDropWarnWindowS = 10;

 private:
  explicit TcpListener(const std::string& localIp);
  void acceptLoop();
  void onHello(int fd, const std::string& from, const uint8_t* data, size_t len);
  // Counts, logs (rate-limited) and closes a connection that failed its
  // handshake. Accept thread only.
  void drop(int fd, const std::string& from, const char* why);

  struct Group {
    HelloGroup shape;
    std::map<std::pair<int, uint16_t>, int> inbox;
    bool closed = false;  // closeGroup()
    int arrivalFd = -1;
  };
  // The connection `key` = (srcRank, channel) of a group, or -1 (mu_ held;
  // throws once the group is shut down).
  int takeLocked(const GroupToken& token, std::pair<int, uint16_t> key);
  int listenFd_;
  std::string address_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<GroupToken, Group> groups_;
  std::atomic<uint64_t> rejected_{0};
  // Once drop()'s window is over: one line for what it did not log.
  void logUnloggedDrops(std::chrono::steady_clock::time_point now);
  // drop()'s log budget (accept thread only).
  std::chrono::steady_clock::time_point dropWindowStart_{};
  int dropsLoggedInWindow_ = 0;
  uint64_t dropsUnlogged_ = 0;
};

// One side of a connection between two members of a group.
struct PairEnd {
  GroupToken token;
  int myRank;
  int peerRank;
  Channel channel;
};
// Opens our side of a pair: connects to the peer's listener and sends Hello.
int connectToPeer(const std::string& peerAddress, const PairEnd& pair, const SocketWait& w);

}  // namespace smdccl
