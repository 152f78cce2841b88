#include "algorithms/op_header.h"

#include <cstdint>
#include <algorithm>
#include <cstring>

#include "common/error.h"

namespace smdccl {

namespace {

constexpr uint32_t kMagic = 0x504F4D53;  // "SMOP"
constexpr uint16_t kVersion = 1;
constexpr size_t kNameBytes = 48;
constexpr size_t kDtypeNameBytes = 24;

// Layout (little-endian host order; peers run the same build):
//  0 magic u32 | 4 version u16 | 6 reserved u16 | 8 seq u64 | 16 count u64 |
// 24 shapeHash u64 | 32 root i32 | 36 senderRank i32 | 40 dtype i8 | 41 redop i8 |
// 42 reserved[6] | 48 name[48] | 96 dtype name[24] (names NUL-padded, truncated) |
// 120 messageBytes u64
template <typename T>
void put(unsigned char* at, T v) {
  std::memcpy(at, &v, sizeof v);
}
template <typename T>
T get(const unsigned char* at) {
  T v;
  std::memcpy(&v, at, sizeof v);
  return v;
}

}  // namespace

OpHeaderBytes encodeOpHeader(const OpSignature& sig, uint64_t seq, int senderRank,
                             uint64_t messageBytes) {
  OpHeaderBytes b{};
  put<uint32_t>(&b[0], kMagic);
  put<uint16_t>(&b[4], kVersion);
  put<uint64_t>(&b[8], seq);
  put<uint64_t>(&b[16], sig.count);
  put<uint64_t>(&b[24], sig.shapeHash);
  put<int32_t>(&b[32], sig.root);
  put<int32_t>(&b[36], senderRank);
  put<int8_t>(&b[40], static_cast<int8_t>(sig.dtype));
  std::memcpy(&b[96], sig.dtypeName.data(), std::min(sig.dtypeName.size(), kDtypeNameBytes));
  put<int8_t>(&b[41], static_cast<int8_t>(sig.redop));
  std::memcpy(&b[48], sig.name.data(), std::min(sig.name.size(), kNameBytes));
  put<uint64_t>(&b[120], messageBytes);
  return b;
}

DecodedOpHeader decodeOpHeader(const unsigned char* b) {
  DecodedOpHeader h;
  if (get<uint32_t>(b) != kMagic || get<uint16_t>(b + 4) != kVersion) return h;
  h.valid = true;
  h.seq = get<uint64_t>(b + 8);
  h.sig.count = get<uint64_t>(b + 16);
  h.sig.shapeHash = get<uint64_t>(b + 24);
  h.sig.root = get<int32_t>(b + 32);
  h.senderRank = get<int32_t>(b + 36);
  h.sig.dtype = get<int8_t>(b + 40);
  h.sig.redop = get<int8_t>(b + 41);
  const char* name = reinterpret_cast<const char*>(b + 48);
  h.sig.name.assign(name, strnlen(name, kNameBytes));
  const char* dtype = reinterpret_cast<const char*>(b + 96);
  h.sig.dtypeName.assign(dtype, strnlen(dtype, kDtypeNameBytes));
  h.messageBytes = get<uint64_t>(b + 120);
  return h;
}

std::string opMismatch(const OpContext& ctx, const DecodedOpHeader& theirs, int peerRank,
                       bool compareShapes, uint64_t expectedBytes) {
  if (!theirs.valid)
    return strCat("rank ", peerRank, " sent data where the header of ", ctx.sig.name, " #", ctx.seq,
                  " was due: the ranks' streams are out of step (a collective that "
                  "only some ranks called, or different sizes, earlier on this group)");
  const OpSignature& a = ctx.sig;
  const OpSignature& b = theirs.sig;
  // Names are compared as sent (truncated to the header's width).
  bool same = theirs.seq == ctx.seq && a.name.substr(0, kNameBytes) == b.name &&
              a.dtypeName.substr(0, kDtypeNameBytes) == b.dtypeName && a.dtype == b.dtype &&
              a.redop == b.redop && a.root == b.root && a.count == b.count &&
              (!compareShapes || a.shapeHash == b.shapeHash);
  if (same && theirs.messageBytes == expectedBytes) return "";
  if (same)
    return strCat("rank ", peerRank, " sends ", theirs.messageBytes,
                  " bytes where this rank "
                  "expects ",
                  expectedBytes, " in ", a.describe(), " #", ctx.seq,
                  a.count == OpSignature::kAnyCount
                      ? ": the ranks' split sizes (what one sends the other) disagree"
                      : ": the ranks disagree on the sizes of the data");
  std::string shapes = compareShapes && a.shapeHash != b.shapeHash && a.count == b.count
                           ? " (same element count, different tensor shapes)"
                           : "";
  return strCat("mismatched collectives: this rank called ", a.describe(), " as its #", ctx.seq,
                " on this group, rank ", peerRank, " called ", b.describe(), " as its #",
                theirs.seq, shapes,
                ". Every rank of a group must call the same collectives in the same order, "
                "with the same dtype, reduce op, root and size");
}

}  // namespace smdccl
