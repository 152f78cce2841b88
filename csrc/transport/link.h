#pragma once
// A Link is an ordered, reliable byte stream to one peer rank, driven without
// blocking: each call moves what it can and returns at once. Algorithms only
// see this interface (shared memory and TCP implement it).
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace smdccl {

class Link {
 public:
  virtual ~Link() = default;
  virtual int peer() const = 0;
  // Moves up to n bytes; returns how many moved (0 when it would block).
  // Throws CommError when the peer is gone.
  virtual size_t send(const void* buf, size_t n) = 0;
  virtual size_t recv(void* buf, size_t n) = 0;
  // Receives up to n bytes and combines them into dst (dst = dst op incoming).
  // Returns bytes consumed; always a multiple of the element size.
  virtual size_t recvReduce(void* dst, size_t n, DType dtype, RedOp op) = 0;
  // Float32 over a 16-bit wire, packed straight into / unpacked straight out
  // of the link's own buffer where it has one (shared memory), saving the
  // staging copy. Return elements moved (whole elements only), or 0 when it
  // would block. Links without a buffer of their own return false from
  // packsInPlace() and the exchange stages for them.
  virtual bool packsInPlace() const { return false; }
  virtual size_t sendPacked(const float* src, size_t elems, Wire wire) { return 0; }
  // dst = unpacked (reduce: dst op unpacked, then rounded to `roundTo`).
  virtual size_t recvUnpacked(float* dst, size_t elems, Wire wire, bool reduce, RedOp op,
                              Wire roundTo) {
    return 0;
  }
  // Marks the end of one message in each direction, so that every message
  // starts aligned (both sides call it after the same messages).
  virtual void endSend() {}
  virtual void endRecv() {}
  // File descriptor to poll() for readiness, or -1 for shared memory.
  virtual int pollFd() const { return -1; }
  virtual const char* kind() const = 0;

  // Op headers (algorithms/op_header.h): the op whose header went out / came
  // in last on this link, and the buffers they move through. One collective
  // runs at a time per group, so one buffer per direction is enough.
  uint64_t headerSentFor = 0, headerRecvFor = 0;
  std::array<unsigned char, 128> headerOut{}, headerIn{};
};

}  // namespace smdccl
