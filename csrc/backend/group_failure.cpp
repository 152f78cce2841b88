// SmdcclBackend's failure policy: the group's fatal state, abort(), the
// first failure recorded for the peers' errors, and the probe connection
// waits use (group_failure.h).
#include "backend/group_failure.h"

#include <algorithm>

#include "backend/backend.h"
#include "backend/torch_error.h"
#include "common/error.h"
#include "common/log.h"

namespace smdccl {

const char* const kFirstFailureKey = "smdccl/first_failure";

std::string recordedFirstFailure(KVStore& store) {
  if (!store.check(kFirstFailureKey)) return "";
  return store.get(kFirstFailureKey, Deadline::after(std::chrono::seconds(5)));
}

std::string GroupFailureProbe::operator()() {
  std::lock_guard<std::mutex> lock(mu_);
  auto now = std::chrono::steady_clock::now();
  if (!found_.empty() || now < next_) return found_;
  next_ = now + interval_;
  try {
    std::string first = recordedFirstFailure(*store_);
    if (!first.empty()) found_ = "the group failed before this link was connected: " + first;
  } catch (const std::exception& e) {
    // The store is unreachable (its host exited): the connection wait goes
    // on to its deadline. Ask less and less often: torch's store client
    // prints a stack trace for each failed request.
    interval_ = std::min(interval_ * 2, std::chrono::milliseconds(8000));
    SMDCCL_INFO("could not read the group's failure from the store: ", e.what());
  }
  return found_;
}

std::string withFirstFailure(KVStore& store, const std::string& mine) {
  const std::string key = kFirstFailureKey;
  try {
    std::string recorded = recordedFirstFailure(store);
    if (!recorded.empty())
      return recorded == mine ? mine : mine + " [first failure in the group: " + recorded + "]";
    if (store.add(key + "/claim", 1) == 1) {
      store.set(key, mine);
    } else {
      // Another rank is writing its cause right now.
      std::string first = store.get(key, Deadline::after(std::chrono::seconds(5)));
      return mine + " [first failure in the group: " + first + "]";
    }
  } catch (const std::exception& e) {
    SMDCCL_INFO("could not share the failure cause through the store: ", e.what());
  }
  return mine;
}

std::exception_ptr GroupFate::fatal() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fatal_;
}

::c10d::ErrorType GroupFate::errorType() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errorType_;
}

std::string GroupFate::abortCause() const {
  std::lock_guard<std::mutex> lock(mu_);
  return abortCause_;
}

bool GroupFate::abort(const std::string& cause, std::exception_ptr err) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!abortCause_.empty()) return false;
  abortCause_ = cause;
  if (!fatal_) {  // an earlier failure stays the group's cause
    fatal_ = err;
    errorType_ = ::c10d::ErrorType::COMM_ERROR;
  }
  return true;
}

void GroupFate::fail(std::exception_ptr err, CommError::Kind kind) {
  std::lock_guard<std::mutex> lock(mu_);
  fatal_ = err;
  errorType_ = kind == CommError::Kind::Timeout       ? ::c10d::ErrorType::TIMEOUT
               : kind == CommError::Kind::PeerFailure ? ::c10d::ErrorType::REMOTE_ERROR
                                                      : ::c10d::ErrorType::COMM_ERROR;
}

::c10d::ErrorType SmdcclBackend::getError() { return fate_.errorType(); }

void SmdcclBackend::abort() {
  std::string cause = strCat("smdccl: group '", cfg_.groupName, "' was aborted on rank ", rank_,
                             " (ProcessGroup.abort())");
  auto err = toTorchError(std::make_exception_ptr(CommError(CommError::Kind::System, cause)));
  if (!fate_.abort(cause, err)) return;
  SMDCCL_WARN(cause);
  deviceOps_->abort(cause);  // GPU work waiting for node-mates stops waiting
  p2p_->abort(err);          // first: a transfer that sees the cancel below reports this cause
  mesh_->cancelWaits();      // the op in flight stops at its next wait (Exchange, connection waits)
  tellPeersAndStop(cause);
}

void SmdcclBackend::tellPeersAndStop(const std::string& cause) {
  // The rest belongs to the progress thread, once the op in flight has
  // stopped: this thread must not block on the store (it may be the
  // caller's, and abort() returns at once, also with the store gone) nor
  // touch the links the progress thread may be connecting. It records the
  // cause for the peers' errors first (the op in flight may record it
  // before, in failGroup: the first record wins), then closes the links so
  // that peers fail naming it.
  bool posted = progress_->post([this, cause] {
    withFirstFailure(*store_, cause);
    mesh_->abortLinks();
  });
  // A stopped thread: the group had failed before, its links are closed and
  // that failure is the recorded cause.
  if (!posted) mesh_->abortLinks();
  progress_->stopWhenIdle();  // what is queued fails at once
}

std::exception_ptr SmdcclBackend::failGroup(const OpContext& ctx, CommError::Kind kind,
                                            const std::string& cause) {
  const std::string aborted = fate_.abortCause();
  if (!aborted.empty()) {
    // Interrupted by abort(): that is the cause, whatever the wait saw.
    std::string msg = strCat(aborted, " while in ", ctx.describe());
    withFirstFailure(*store_, msg);  // peers name it...
    mesh_->abortLinks();             // ...once they see the links close
    return toTorchError(std::make_exception_ptr(CommError(kind, msg)));
  }
  // Exchange names the op; a failure outside it (e.g. connecting a link on
  // first use, an allocation) does not yet.
  std::string where = strCat("smdccl: ", ctx.describe());
  std::string what = cause.compare(0, where.size(), where) != 0 ? where + ": " + cause : cause;
  std::string msg = withFirstFailure(*store_, what);
  SMDCCL_WARN(msg);
  mesh_->abortLinks();  // only after the cause is in the store
  std::exception_ptr err = toTorchError(std::make_exception_ptr(CommError(kind, msg)));
  fate_.fail(err, kind);
  // GPU work queued for node-mates that may never meet it stops waiting;
  // the works of the ops it lets through report this failure.
  deviceOps_->abort(msg);
  // Nothing can run on this group any more: what is queued fails fast,
  // then the thread exits; later calls fail on the caller's thread.
  progress_->stopWhenIdle();
  return err;
}

void SmdcclBackend::failFromDevice(const std::string& cause) {
  if (fate_.fatal()) return;  // failed (or aborted) first: that is the group's error
  auto err = toTorchError(std::make_exception_ptr(CommError(CommError::Kind::Timeout, cause)));
  fate_.fail(err, CommError::Kind::Timeout);
  tellPeersAndStop(cause);  // from the barrier's watch thread, as abort() from any
}

}  // namespace smdccl
