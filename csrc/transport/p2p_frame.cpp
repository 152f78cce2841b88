#include "transport/p2p_frame.h"

#include <algorithm>

#include "transport/byte_order.h"

namespace smdccl {

P2PHeaderParse parseP2PHeader(const uint8_t* data, size_t len) {
  P2PHeaderParse r;
  if (data == nullptr || len < sizeof(P2PHeader)) {
    r.why = "incomplete header";
    return r;
  }
  P2PHeader& h = r.header;
  h.magic = static_cast<uint32_t>(loadLE(data, 4));
  h.flags = static_cast<uint32_t>(loadLE(data + 4, 4));
  h.tag = static_cast<int64_t>(loadLE(data + 8, 8));
  h.bytes = loadLE(data + 16, 8);
  if (h.magic != P2PHeader::kMagic) {
    r.why = "bad magic";
  } else if (h.bytes > P2PHeader::kMaxBytes) {
    r.why = "length over the limit";
  } else {
    r.ok = true;
  }
  return r;
}

void encodeP2PHeader(const P2PHeader& h, uint8_t out[sizeof(P2PHeader)]) {
  storeLE(out, h.magic, 4);
  storeLE(out + 4, h.flags, 4);
  storeLE(out + 8, static_cast<uint64_t>(h.tag), 8);
  storeLE(out + 16, h.bytes, 8);
}

void recvPayload(int fd, std::vector<char>& out, uint64_t bytes, const SocketWait& w) {
  out.clear();
  size_t got = 0;
  while (got < bytes) {
    // Grow by what has arrived so far (at least a chunk): the allocation
    // follows the data, not the length field.
    size_t step =
        static_cast<size_t>(std::min<uint64_t>(bytes - got, std::max(kPayloadChunk, got)));
    out.resize(got + step);
    recvAll(fd, out.data() + got, step, w);
    got += step;
  }
}

void discardPayload(int fd, uint64_t bytes, const SocketWait& w) {
  if (bytes == 0) return;
  std::vector<char> sink(static_cast<size_t>(std::min<uint64_t>(bytes, kPayloadChunk)));
  while (bytes > 0) {
    size_t step = static_cast<size_t>(std::min<uint64_t>(bytes, sink.size()));
    recvAll(fd, sink.data(), step, w);
    bytes -= step;
  }
}

}  // namespace smdccl
