#pragma once
// A Link over one non-blocking TCP socket.
#include <memory>

#include "transport/link.h"

namespace smdccl {

class TcpLink : public Link {
 public:
  TcpLink(int fd, int peerRank);  // takes ownership of fd
  ~TcpLink() override;
  int peer() const override { return peer_; }
  size_t send(const void* buf, size_t n) override;
  size_t recv(void* buf, size_t n) override;
  size_t recvReduce(void* dst, size_t n, DType dtype, RedOp op) override;
  int pollFd() const override { return fd_; }
  const char* kind() const override { return "tcp"; }

 private:
  [[noreturn]] void fail(const char* what, int err) const;
  int fd_;
  int peer_;
  // Bytes that arrived for recvReduce but do not yet fill a whole element.
  std::unique_ptr<char[]> staging_;
  size_t stagingFill_ = 0;
};

}  // namespace smdccl
