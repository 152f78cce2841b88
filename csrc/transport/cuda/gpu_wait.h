#pragma once
// Host waits for GPU work with the op's deadline: cudaStreamSynchronize and
// cudaEventSynchronize cannot give up, so these poll (spin, then yield, then
// sleep) and throw a Timeout that names the op and what it waited for.
#include <cuda_runtime_api.h>

#include <string>

#include "common/op_context.h"
#include "common/deadline.h"

namespace smdccl {

void waitForEvent(cudaEvent_t ev, const OpContext& ctx, const char* what);
void waitForStream(cudaStream_t s, const OpContext& ctx, const char* what);
// Outside a collective (a group's end): `what` names the wait.
void waitForStream(cudaStream_t s, Deadline deadline, const std::string& what);

}  // namespace smdccl
