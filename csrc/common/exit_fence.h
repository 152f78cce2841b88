#pragma once
// Our threads (progress, send/recv) may drop the last reference to a tensor
// that Python owns, which takes the GIL. Once the interpreter is finalizing,
// a thread that takes the GIL is ended by a forced unwind, and that unwind
// std::terminate()s inside the destructor that dropped the reference: a
// script that exits without destroy_process_group() aborted about 1 run in
// 20 after send/recv. smdccl's atexit hook (run before finalization) calls
// markProcessExiting(); from then on these threads leak such objects
// instead of dropping them (the process is going away).
#include <atomic>
#include <utility>

namespace smdccl {

namespace exit_fence {
extern std::atomic<bool> exiting;
extern std::atomic<int> dropping;  // threads inside dropOrLeak()
}  // namespace exit_fence

// Called once from the interpreter's atexit, with the GIL released: raises
// the flag, then waits (up to 2 s) for drops already under way to finish.
void markProcessExiting();

// Destroys `obj`'s contents here (moved out and dropped), or, once the
// process is exiting, leaks them.
template <typename T>
void dropOrLeak(T& obj) {
  exit_fence::dropping.fetch_add(1);  // seq_cst, paired with markProcessExiting
  if (exit_fence::exiting.load()) {
    exit_fence::dropping.fetch_sub(1);
    new T(std::move(obj));  // never freed, on purpose
    return;
  }
  { T dead(std::move(obj)); }
  exit_fence::dropping.fetch_sub(1);
}

}  // namespace smdccl
