#pragma once
// Error types the engine throws; the backend turns them into Python
// exceptions (RuntimeError, or ValueError for bad input) with the message as is.
#include <sstream>
#include <stdexcept>
#include <string>

namespace smdccl {

class CommError : public std::runtime_error {
 public:
  enum class Kind { Timeout, PeerFailure, Protocol, System, Mismatch };
  CommError(Kind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Concatenates its arguments with operator<< into a string.
template <typename... Args>
std::string strCat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// errno-carrying system failure: "what: strerror(errno)".
[[noreturn]] void throwSystemError(const std::string& what, int err);

}  // namespace smdccl

#define SMDCCL_CHECK_ARG(cond, ...)                                              \
  do {                                                                           \
    if (!(cond)) throw ::smdccl::InvalidArgument(::smdccl::strCat(__VA_ARGS__)); \
  } while (0)
