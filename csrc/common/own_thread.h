#pragma once
// Which threads are smdccl's own (progress, send, receive). Device code uses
// it to change a per-thread setting for good on our threads, and only for
// the length of a call on a caller's thread (see transport/cuda/capture_mode.h).

namespace smdccl {

// Called first thing by each thread smdccl starts; `name` (at most 15
// characters, Linux's limit) names it in /proc/PID/task/*/comm, top -H,
// gdb and py-spy.
void markOwnThread(const char* name = nullptr);
bool isOwnThread();

}  // namespace smdccl
