#pragma once
// The op header: 128 bytes that open the first message of each collective on
// each link and direction. The receiver compares it with its own call, so
// ranks that call different collectives, ops, dtypes, roots or sizes at the
// same step get an error naming both calls instead of reading each other's
// bytes as data (or hanging). Cheap: one small message per link per op.
#include <array>
#include <cstdint>
#include <string>

#include "common/op_context.h"

namespace smdccl {

constexpr size_t kOpHeaderBytes = 128;
using OpHeaderBytes = std::array<unsigned char, kOpHeaderBytes>;

// `senderRank`: this rank's rank in the group (for the peer's message);
// `messageBytes`: the size of the message the header opens (its receiver
// expects the same: it catches what the signature cannot, e.g. all_to_all
// split sizes that disagree between two ranks).
OpHeaderBytes encodeOpHeader(const OpSignature& sig, uint64_t seq, int senderRank,
                             uint64_t messageBytes);

struct DecodedOpHeader {
  bool valid = false;  // magic and version right
  OpSignature sig;
  uint64_t seq = 0;
  int senderRank = -1;
  uint64_t messageBytes = 0;
};
DecodedOpHeader decodeOpHeader(const unsigned char* bytes);

// "" when `theirs` is the call `ctx` makes and opens a message of
// `expectedBytes`; else what differs, naming both calls. `compareShapes`:
// the full fingerprint (DETAIL).
std::string opMismatch(const OpContext& ctx, const DecodedOpHeader& theirs, int peerRank,
                       bool compareShapes, uint64_t expectedBytes);

}  // namespace smdccl
