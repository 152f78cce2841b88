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

}  // namespace smdccl
