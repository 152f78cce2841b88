#pragma once
// Watches GPU work that the host does not wait for (NCCL's collectives,
// queued on a stream whole): a thread of its own polls an event behind each
// watched op; one not finished by its deadline, or a failure the probe
// reports (NCCL's asynchronous error), calls `failed` once with the op's
// name, and the watch stops (the group has failed). Events come from the
// device's pool (event_pool.h).
#include <cuda_runtime_api.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "transport/watched_failure.h"

namespace smdccl {

class StreamWatch {
 public:
  struct Hooks {
    // "" while all is well, else what went wrong (polled every turn).
    std::function<std::string()> probe;
    // Called once, on the watch's thread, with the message of the failure.
    std::function<void(const std::string&)> failed;
  };
  StreamWatch(int device, Hooks hooks);
  // Stops the thread; ops still watched are no longer watched.
  ~StreamWatch();
  StreamWatch(const StreamWatch&) = delete;
  StreamWatch& operator=(const StreamWatch&) = delete;

  // Marks what `stream` has queued so far; `what` names the op (built only
  // on a failure). On a failure, every op still watched has its `failures`
  // told (the op's and those of the ops fused into it).
  // After the watch (or anything else) failed the group, an op watched
  // from now on is told that failure at once: its NCCL call may have been
  // queued on an aborted communicator, whose kernels end without the data.
  void watch(cudaStream_t stream, Deadline deadline, std::function<std::string()> what,
             std::vector<std::shared_ptr<WatchedFailure>> failures);
  // The group failed or was aborted (`why`), and NCCL is about to be
  // aborted: its kernels then end early and their events complete, so
  // every op watched whose work has not finished yet is told now, and the
  // watch stops as after a failure of its own.
  void failAll(const std::string& why);

 private:
  struct Watched {
    cudaEvent_t event;
    Deadline deadline;
    std::function<std::string()> what;
    std::vector<std::shared_ptr<WatchedFailure>> failures;
  };
  void loop();
  // The oldest op's verdict: done (true), or still running; throws nothing.
  std::string checkOldest(bool* done);

  int device_;
  Hooks hooks_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Watched> watched_;
  bool stop_ = false, failed_ = false;
  std::string why_;  // the failure, once failed_
  std::thread thread_;
};

}  // namespace smdccl
