// The NCCL watch (transport/cuda/stream_watch.h) when the group fails from
// outside it (failGroup, ProcessGroup.abort()): NCCL's aborted kernels end
// early and their events complete, so the ops still running must be told
// before that, an op that finished keeps its success, and an op watched
// afterwards is told at once. A stream held by a host function stands for
// NCCL's kernels waiting for a node-mate. Runs only where a GPU is
// (test_kernels.cu exits 77 first otherwise).
#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "check.h"
#include "transport/cuda/stream_watch.h"

using namespace smdccl;

namespace {

std::atomic<bool> gReleased{false};

void CUDART_CB holdStream(void*) {
  while (!gReleased.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

std::shared_ptr<WatchedFailure> fresh() { return std::make_shared<WatchedFailure>(); }

}  // namespace

TEST(stream_watch_fail_all_tells_the_unfinished_and_every_later_op) {
  CHECK(cudaSetDevice(0) == cudaSuccess);
  cudaStream_t held = nullptr, idle = nullptr;
  CHECK(cudaStreamCreateWithFlags(&held, cudaStreamNonBlocking) == cudaSuccess);
  CHECK(cudaStreamCreateWithFlags(&idle, cudaStreamNonBlocking) == cudaSuccess);
  gReleased = false;
  CHECK(cudaLaunchHostFunc(held, holdStream, nullptr) == cudaSuccess);
  std::atomic<int> handlerCalls{0};
  {
    StreamWatch watch(0, {.probe = nullptr, .failed = [&](const std::string&) { ++handlerCalls; }});
    auto finished = fresh(), running = fresh(), later = fresh();
    watch.watch(idle, Deadline::never(), [] { return std::string("allreduce #1"); }, {finished});
    CHECK(cudaStreamSynchronize(idle) == cudaSuccess);
    watch.watch(held, Deadline::never(), [] { return std::string("allreduce #2"); }, {running});
    watch.failAll("group aborted");
    CHECK(!finished->failed.load());  // its work was done: it keeps its success
    CHECK(running->failed.load() && running->message == "group aborted");
    watch.watch(held, Deadline::never(), [] { return std::string("allreduce #3"); }, {later});
    CHECK(later->failed.load() && later->message == "group aborted");
    // Told once: a second failure does not rewrite what an op was told.
    watch.failAll("again");
    CHECK(running->message == "group aborted");
    gReleased = true;
    CHECK(cudaStreamSynchronize(held) == cudaSuccess);
  }
  // The caller handles its own failure: the watch's handler is for the
  // failures the watch finds.
  CHECK(handlerCalls.load() == 0);
  CHECK(cudaStreamDestroy(held) == cudaSuccess);
  CHECK(cudaStreamDestroy(idle) == cudaSuccess);
}
