#pragma once
// Which threads are smdccl's own (progress, send, receive). Device code uses
// it to change a per-thread setting for good on our threads, and only for
// the length of a call on a caller's thread (see transport/cuda/capture_mode.h).

namespace smdccl {

// Called first thing by each thread smdccl starts.
void markOwnThread();
bool isOwnThread();

}  // namespace smdccl
