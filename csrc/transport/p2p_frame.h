#pragma once
// The send/recv wire format: a fixed header {magic, flags, tag, bytes} in
// front of each payload. Pure parsing, shared with the fuzz test (the
// payload reads whose length comes off the wire: p2p_reader.h).
#include <cstddef>
#include <cstdint>

namespace smdccl {

// The first byte on a send/recv connection, from its sender: where the
// messages' bytes go. Over the connection itself, or (ranks of one node)
// through a shared-memory ring, the connection then carrying wake-ups only
// (p2p_shm_stream.h).
enum P2PPath : char { kP2PBySocket = 'T', kP2PByShm = 'S' };

// The header in front of every send/recv payload (little-endian on the wire).
struct P2PHeader {
  static constexpr uint32_t kMagic = 0x50325053;  // "SP2P"
  // Sanity bound on a header's length field: anything above is corruption.
  static constexpr uint64_t kMaxBytes = uint64_t(1) << 40;
  // flags: kNonFinite says the payload is the sender's SMDCCL_NAN_CHECK
  // report (text), not the data; kSenderFailed that it is why the sender
  // could not send its data (text: e.g. the copy of a CUDA tensor failed);
  // other bits are ignored.
  static constexpr uint32_t kNonFinite = 1;
  static constexpr uint32_t kSenderFailed = 2;
  static bool carriesReport(uint32_t flags) { return flags & (kNonFinite | kSenderFailed); }
  uint32_t magic;
  uint32_t flags;
  int64_t tag;     // any value: user tags
  uint64_t bytes;  // payload length
};
static_assert(sizeof(P2PHeader) == 24, "P2PHeader is a wire format");

// Pure header parsing, shared with the fuzz test: decodes the header at the
// start of `data`; rejects fewer than sizeof(P2PHeader) bytes, a wrong magic,
// or a length over kMaxBytes, with `why` set. Never reads past data + len.
struct P2PHeaderParse {
  bool ok = false;
  const char* why = nullptr;
  P2PHeader header{};
};
P2PHeaderParse parseP2PHeader(const uint8_t* data, size_t len);
void encodeP2PHeader(const P2PHeader& h, uint8_t out[sizeof(P2PHeader)]);

}  // namespace smdccl
