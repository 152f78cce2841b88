#pragma once
// A copy whose stores bypass the caches (non-temporal): dst's lines are not
// read before they are written and none stays in this core's caches. For a
// destination that another core reads next and whose lines that core may
// hold (see transport/copy_choice.h). Ends with a store fence, so a release
// store after it publishes the bytes like plain stores. x86-64 (SSE2, part
// of the base ISA); elsewhere memcpy.
#include <cstddef>

namespace smdccl {

void streamCopy(void* dst, const void* src, size_t n);

}  // namespace smdccl
