#pragma once
// A Link is an ordered, reliable byte stream to one peer rank, driven without
// blocking: each call moves what it can and returns at once. It moves bytes
// only: op headers, reductions and 16-bit casts belong to the exchange
// (algorithms/exchange.h). Shared memory and TCP implement it.
#include <cstddef>
#include <cstdint>

namespace smdccl {

class Link {
 public:
  virtual ~Link() = default;
  virtual int peer() const = 0;
  // Moves up to n bytes; returns how many moved (0 when it would block).
  // Throws CommError when the peer is gone.
  virtual size_t send(const void* buf, size_t n) = 0;
  virtual size_t recv(void* buf, size_t n) = 0;
  // In place, for a link with a buffer of its own (shared memory), so that
  // the layer above can reduce or cast straight out of / into it: readable()
  // points at bytes that arrived (contiguous; returns how many, 0 if none)
  // and consume(k) releases the first k; writable() points at free space
  // and commit(k) publishes the first k bytes written there. Links without
  // such a buffer return false from inPlace() and 0 from both.
  virtual bool inPlace() const { return false; }
  virtual size_t readable(const char** at) { return 0; }
  virtual void consume(size_t k) {}
  virtual size_t writable(char** at) { return 0; }
  virtual void commit(size_t k) {}
  // Marks the end of one message in each direction, so that every message
  // starts aligned (both sides call it after the same messages).
  virtual void endSend() {}
  virtual void endRecv() {}
  // File descriptor to poll() for readiness, or -1 for shared memory.
  virtual int pollFd() const { return -1; }
  virtual const char* kind() const = 0;
};

}  // namespace smdccl
