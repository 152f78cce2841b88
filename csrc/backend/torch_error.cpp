#include "backend/torch_error.h"

#include <c10/util/Exception.h>

#include "common/error.h"

namespace smdccl {

std::exception_ptr toTorchError(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const c10::Error&) {
    return std::current_exception();
  } catch (const InvalidArgument& ex) {
    try {
      C10_THROW_ERROR(ValueError, ex.what());
    } catch (...) { return std::current_exception(); }
  } catch (const std::exception& ex) {
    try {
      C10_THROW_ERROR(DistBackendError, ex.what());
    } catch (...) { return std::current_exception(); }
  }
  return e;
}

}  // namespace smdccl
