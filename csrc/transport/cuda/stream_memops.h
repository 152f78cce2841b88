#pragma once
// Stream-ordered waits on, and writes of, a 64-bit counter in mapped host
// memory, done by the GPU's front end (cuStreamWaitValue64 /
// cuStreamWriteValue64): no kernel spins, so nothing holds an SM and a
// lazily loaded kernel launched meanwhile cannot deadlock against it. The
// driver functions are reached through the runtime's entry-point query, so
// nothing links libcuda (absent on machines without a GPU driver).
#include <cuda_runtime_api.h>

#include <cstdint>

namespace smdccl {

// `counter` must come from cudaHostAlloc(..., cudaHostAllocMapped).
// Return false where the device or driver lacks 64-bit stream memory
// operations (the caller then falls back); throw on other CUDA errors.
bool streamWaitAtLeast(cudaStream_t stream, volatile uint64_t* counter, uint64_t value);
bool streamWrite(cudaStream_t stream, volatile uint64_t* counter, uint64_t value);

}  // namespace smdccl
