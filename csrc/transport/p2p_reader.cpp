#include "transport/p2p_reader.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/error.h"
#include "transport/socket_util.h"

namespace smdccl {

size_t P2PSocketSource::take(char* at, size_t room) {
  ssize_t k = ::recv(fd_, at, room, MSG_DONTWAIT);
  if (k > 0) return static_cast<size_t>(k);
  if (k < 0 && tryAgain(errno)) return 0;
  if (k == 0) throw CommError(CommError::Kind::PeerFailure, peer_ + " closed the connection");
  throw CommError(CommError::Kind::PeerFailure,
                  strCat("connection to ", peer_, " failed: ", std::strerror(errno)));
}

void P2PReader::sinkTo(Sink sink, void* into) {
  stage_ = sink == Sink::Into ? Stage::Into : sink == Sink::Buffer ? Stage::Buffer : Stage::Drain;
  into_ = static_cast<char*>(into);
  buf_.clear();
  got_ = 0;
}

void P2PReader::redirect(Sink sink, void* into) {
  if (sink == Sink::Into && got_) std::memcpy(into, buf_.data(), static_cast<size_t>(got_));
  stage_ = sink == Sink::Into ? Stage::Into : Stage::Drain;
  into_ = static_cast<char*>(into);
  std::vector<char>().swap(buf_);  // its memory too (= {} would keep it)
}

void P2PReader::next() {
  if (stage_ == Stage::Drain) std::vector<char>().swap(sink_);  // drains are rare: not kept
  stage_ = Stage::Header;
  headGot_ = 0;
  got_ = 0;
  into_ = nullptr;
  std::vector<char>().swap(buf_);  // its memory too (= {} would keep it)
}

char* P2PReader::space(size_t* room) {
  switch (stage_) {
    case Stage::Header:
      *room = sizeof head_ - headGot_;
      return reinterpret_cast<char*>(head_) + headGot_;
    case Stage::Into: *room = static_cast<size_t>(h_.bytes - got_); return into_ + got_;
    case Stage::Buffer:
      if (got_ == buf_.size()) {
        // Grow by what has arrived so far (at least a chunk): the
        // allocation follows the data, not the length field.
        uint64_t step =
            std::min<uint64_t>(h_.bytes - got_, std::max<uint64_t>(kPayloadChunk, got_));
        buf_.resize(static_cast<size_t>(got_ + step));
      }
      *room = buf_.size() - static_cast<size_t>(got_);
      return buf_.data() + got_;
    case Stage::Drain:
      sink_.resize(static_cast<size_t>(std::min<uint64_t>(h_.bytes, kPayloadChunk)));
      *room = static_cast<size_t>(std::min<uint64_t>(h_.bytes - got_, sink_.size()));
      return sink_.data();
    case Stage::Sinkless: break;
  }
  *room = 0;
  return nullptr;
}

P2PReader::Event P2PReader::read(P2PByteSource& from, uint64_t* budget) {
  while (*budget > 0) {
    if (stage_ == Stage::Sinkless) return Event::Header;  // sinkTo() first
    if (complete()) return Event::Message;
    size_t room;
    char* at = space(&room);
    room = static_cast<size_t>(std::min<uint64_t>(room, *budget));
    size_t k = from.take(at, room);
    if (k == 0) return Event::Idle;
    *budget -= static_cast<uint64_t>(k);
    if (stage_ != Stage::Header) {
      got_ += static_cast<uint64_t>(k);
      if (complete()) return Event::Message;
      continue;
    }
    headGot_ += static_cast<size_t>(k);
    if (headGot_ < sizeof head_) continue;
    P2PHeaderParse parsed = parseP2PHeader(head_, sizeof head_);
    if (!parsed.ok)
      throw CommError(CommError::Kind::Protocol,
                      strCat("corrupt message header (", parsed.why, ")"));
    h_ = parsed.header;
    stage_ = Stage::Sinkless;
    return Event::Header;
  }
  return Event::Idle;
}

}  // namespace smdccl
