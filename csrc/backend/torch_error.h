#pragma once
// Engine exceptions as torch's Python-visible types: InvalidArgument ->
// ValueError, any other -> DistBackendError; torch's own pass through.
#include <exception>

namespace smdccl {

std::exception_ptr toTorchError(std::exception_ptr e);

}  // namespace smdccl
