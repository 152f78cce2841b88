// What ops learn when their watched GPU work fails after they returned
// (transport/watched_failure.h): every op fused into the watched collective
// is told, an earlier collective's ops are not, and each op once.
#include <memory>
#include <string>

#include "check.h"
#include "transport/watched_failure.h"

using namespace smdccl;

namespace {
std::shared_ptr<WatchedFailure> fresh() { return std::make_shared<WatchedFailure>(); }
}  // namespace

TEST(watched_failure_tells_every_op_fused_into_the_collective) {
  OpFailures set;
  auto done = fresh(), leader = fresh(), rider1 = fresh(), rider2 = fresh();
  set.join(6, done);  // an earlier collective, finished
  set.join(7, leader);
  set.join(7, rider1);  // fused: prepared inside collective 7
  set.join(7, rider2);
  CHECK(set.all().size() == 3);
  tellFailed(set.all(), "allreduce #7: NCCL's work did not finish");
  for (const auto& f : {leader, rider1, rider2})
    CHECK(f->failed.load() && f->message == "allreduce #7: NCCL's work did not finish");
  CHECK(!done->failed.load());
  // Once per op: a later failure does not rewrite what an op was told.
  tellFailed(set.all(), "later");
  CHECK(rider2->message == "allreduce #7: NCCL's work did not finish");
}

TEST(watched_failure_starts_a_new_set_per_collective) {
  OpFailures set;
  auto a = fresh(), b = fresh(), c = fresh(), d = fresh();
  set.join(3, a);
  set.join(4, b);
  CHECK(set.all().size() == 1 && set.all()[0] == b);
  // Unnumbered ops (seq 0) are never taken for one collective.
  set.join(0, c);
  set.join(0, d);
  CHECK(set.all().size() == 1 && set.all()[0] == d);
  tellFailed(set.all(), "x");
  CHECK(d->failed.load() && !a->failed.load() && !b->failed.load() && !c->failed.load());
}
