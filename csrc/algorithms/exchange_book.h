#pragma once
// What the exchanges of one group keep per peer from one op to the next:
// which op's header went out / came in last on the link to that peer (the
// first message of each op in each direction carries one), the buffers the
// headers move through, and a receive-and-reduce's bytes from a link that
// cannot be read in place (TCP) that do not yet fill an element. One
// collective runs at a time per group, so one of each per peer is enough.
// The group owns it (Comm::book); links stay byte streams.
#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "algorithms/op_header.h"

namespace smdccl {

class ExchangeBook {
 public:
  struct Peer {
    uint64_t headerSentFor = 0, headerRecvFor = 0;
    OpHeaderBytes headerOut{}, headerIn{};
    std::vector<char> reduceStaging;  // allocated at the first staged receive-and-reduce
    size_t reduceStaged = 0;
  };
  // `peer`: the group rank at the other end of the link. References stay
  // valid as peers are added.
  Peer& of(int peer) { return peers_[peer]; }
  // The int8 algorithms' quantized pieces (two_level_int8.cpp), kept so a
  // large op does not fault in fresh pages each time.
  std::vector<char> quantized;

 private:
  std::unordered_map<int, Peer> peers_;
};

}  // namespace smdccl
