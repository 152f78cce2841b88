#include "common/own_thread.h"

namespace smdccl {

namespace {
thread_local bool ownThread = false;
}

void markOwnThread() { ownThread = true; }
bool isOwnThread() { return ownThread; }

}  // namespace smdccl
