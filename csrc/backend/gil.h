#pragma once
// Lets go of Python's GIL for a scope, if this thread holds it. The backend
// is destroyed from Python (pybind11 dealloc, GIL held) while its progress
// thread may be dropping the last reference to a Work whose tensors belong to
// Python objects, which takes the GIL: joining that thread with the GIL held
// would deadlock.
#include <Python.h>

namespace smdccl {

class GilReleasedIfHeld {
 public:
  GilReleasedIfHeld() {
    if (Py_IsInitialized() && PyGILState_Check()) state_ = PyEval_SaveThread();
  }
  ~GilReleasedIfHeld() {
    if (state_) PyEval_RestoreThread(state_);
  }
  GilReleasedIfHeld(const GilReleasedIfHeld&) = delete;
  GilReleasedIfHeld& operator=(const GilReleasedIfHeld&) = delete;

 private:
  PyThreadState* state_ = nullptr;
};

}  // namespace smdccl
