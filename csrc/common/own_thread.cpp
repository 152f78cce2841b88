#include "common/own_thread.h"

#include <pthread.h>

namespace smdccl {

namespace {
thread_local bool ownThread = false;
}

void markOwnThread(const char* name) {
  ownThread = true;
  if (name) pthread_setname_np(pthread_self(), name);
}
bool isOwnThread() { return ownThread; }

}  // namespace smdccl
