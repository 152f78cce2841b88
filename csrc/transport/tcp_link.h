#pragma once
// A Link over one non-blocking TCP socket.
#include "transport/link.h"

namespace smdccl {

class TcpLink : public Link {
 public:
  TcpLink(int fd, int peerRank);  // takes ownership of fd
  ~TcpLink() override;
  int peer() const override { return peer_; }
  size_t send(const void* buf, size_t n) override;
  size_t recv(void* buf, size_t n) override;
  int pollFd() const override { return fd_; }
  const char* kind() const override { return "tcp"; }

 private:
  [[noreturn]] void fail(const char* what, int err) const;
  int fd_;
  int peer_;
};

}  // namespace smdccl
