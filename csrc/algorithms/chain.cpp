// Broadcast: a binomial tree for small messages (log2(p) hops), a pipelined
// chain along the ring for large ones (every link busy, ~1x the bytes per
// link once the pipeline is full).
#include <algorithm>

#include "algorithms/comm.h"

namespace smdccl {

void treeBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  int p = c.size();
  if (p == 1) return;
  int vr = (c.rank() - root + p) % p;
  Exchange ex = c.exchange();
  int mask = 1;
  while (mask < p) mask <<= 1;
  // Receive from the parent (the rank that differs in our lowest set bit)...
  for (int m = 1; m < p; m <<= 1) {
    if (vr & m) {
      ex.recv(c.link(((vr - m) + root) % p), buf, bytes).run();
      break;
    }
  }
  // ...then send to children, largest subtree first.
  int low = vr == 0 ? mask : (vr & -vr);
  for (int m = low >> 1; m >= 1; m >>= 1)
    if (vr + m < p) ex.send(c.link((vr + m + root) % p), buf, bytes);
  ex.run();
}

void chainBroadcast(Comm& c, char* buf, size_t bytes, int root) {
  int p = c.size();
  if (p == 1) return;
  // The chain starts at root and follows the ring order from there.
  int rootPos = static_cast<int>(std::find(c.ring.begin(), c.ring.end(), root) - c.ring.begin());
  int pos = c.ringPosition();
  int hop = (pos - rootPos + p) % p;
  Link* prev = hop > 0 ? &c.link(c.ring[(pos - 1 + p) % p]) : nullptr;
  Link* next = hop < p - 1 ? &c.link(c.ring[(pos + 1) % p]) : nullptr;
  constexpr size_t kChunk = 512 << 10;
  size_t chunks = std::max<size_t>(1, (bytes + kChunk - 1) / kChunk);
  Exchange ex = c.exchange();
  // Step k receives chunk k while forwarding chunk k-1.
  for (size_t k = 0; k <= chunks; ++k) {
    if (prev && k < chunks) {
      size_t off = k * kChunk;
      ex.recv(*prev, buf + off, std::min(kChunk, bytes - std::min(bytes, off)));
    }
    if (next && k > 0) {
      size_t off = (k - 1) * kChunk;
      ex.send(*next, buf + off, std::min(kChunk, bytes - std::min(bytes, off)));
    }
    ex.run();
  }
}

}  // namespace smdccl
