#include "common/error.h"

#include <cstring>

namespace smdccl {

void throwSystemError(const std::string& what, int err) {
  throw CommError(CommError::Kind::System, strCat(what, ": ", std::strerror(err)));
}

}  // namespace smdccl
