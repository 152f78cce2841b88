#include "backend/backend.h"

#include <cstdint>
#include <sched.h>
#include <unistd.h>

#include <c10/core/StreamGuard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <fstream>
#include <thread>

#include "backend/gil.h"
#include "backend/store_adapter.h"
#include "common/env.h"
#include "common/exit_fence.h"
#include "common/hash.h"
#include "common/monitored_barrier.h"
#include "common/log.h"
#include "common/trace.h"
#include "topology/topology.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_TEXT(kTopology, "SMDCCL_TOPOLOGY", "",
                "Override host detection: '2x2' (2 nodes of 2 ranks) or '3,1' (uneven nodes), by "
                "global rank order. Ranks on different virtual nodes talk over TCP.");
SMDCCL_ENV_INT(kShmRingKB, "SMDCCL_SHM_RING_KB", 1024, 4, 1 << 20,
               "Shared-memory ring size per direction per peer pair, in KiB.");
SMDCCL_ENV_INT(kSpinUs, "SMDCCL_SPIN_US", -1, -1, 10000000,
               "Microseconds a waiting thread spins before yielding and then sleeping (-1: "
               "chosen from the number of local ranks and cores).");
SMDCCL_ENV_INT(kIdleSpinUs, "SMDCCL_IDLE_SPIN_US", -1, -1, 10000000,
               "Microseconds the progress thread polls for new work before sleeping (-1: "
               "automatic).");
SMDCCL_ENV_INT(kFusionMB, "SMDCCL_FUSION_MB", 16, 0, 1024,
               "Tensor fusion: async allreduces of up to 1 MiB queued back to back (same dtype "
               "and op) are packed into one buffer of up to this many MiB and reduced as one "
               "collective; 0 turns it off. Ranks agree on how many to fuse, and that their "
               "sizes match, with two tiny extra rounds.");
SMDCCL_ENV_INT(kNanCheck, "SMDCCL_NAN_CHECK", 0, 0, 1,
               "1: before each collective, check the float inputs for NaN/Inf; the ranks agree "
               "on whose inputs hold any and every rank raises ValueError naming them and the op "
               "(the collective does not run). Costs a scan and one tiny round per collective; "
               "turns fusion off.");
SMDCCL_ENV_NUMBER(kWarnAfter, "SMDCCL_WARN_AFTER", 60, 0, 1e9,
                  "Seconds a collective may wait before a warning lists which ranks of the group "
                  "are in it, done with it, not arrived yet (with the last collective they "
                  "reached) or not answering; 0: never. The group timeout still ends the wait "
                  "with an error.");
}  // namespace env

namespace {

std::string bootId() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return boot;
}

std::string hostKey() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  return std::string(host) + "/" + bootId();
}

int usableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::thread::hardware_concurrency());
}

// Spinning only pays while every rank on this machine has a core;
// oversubscribed, a spinner steals the core of the rank it waits for.
// `machineRanks` counts the group's ranks under this kernel (same boot id):
// more than the node's ranks when nodes are emulated (namespaces,
// SMDCCL_TOPOLOGY) on one machine.
WaitPolicy pickWaitPolicy(int machineRanks) {
  WaitPolicy w;
  bool oversubscribed = machineRanks > usableCores();
  int64_t spin = envInt(env::kSpinUs);
  w.spinUs = spin >= 0 ? static_cast<int>(spin) : (oversubscribed ? 0 : 50);
  w.yieldUs = oversubscribed ? 300 : 2000;
  return w;
}

int pickIdleSpin(int machineRanks) {
  int64_t v = envInt(env::kIdleSpinUs);
  if (v >= 0) return static_cast<int>(v);
  return machineRanks > usableCores() ? 20 : 200;
}

// Every rank's "hostname/boot id": who shares memory, and who shares CPUs.
std::vector<std::string> gatherHostKeys(KVStore& store, const BackendConfig& cfg,
                                        Deadline deadline) {
  try {
    return allGatherStrings(store, "smdccl/host", cfg.rank, cfg.size, hostKey(), deadline);
  } catch (const CommError& e) {  // the first rendezvous of a group: say what usually causes it
    throw CommError(
        e.kind(), strCat("smdccl: creating group '", cfg.groupName, "' as rank ", cfg.rank, " of ",
                         cfg.size, ": ", e.what(), "; every one of its ", cfg.size,
                         " ranks must create it within the timeout, with the same world size "
                         "and members"));
  }
}

Topology buildTopology(const std::vector<std::string>& hostKeys, const BackendConfig& cfg) {
  std::vector<int> spec = parseTopologySpec(envString(env::kTopology));
  if (!spec.empty()) {
    bool wholeWorld = static_cast<int>(cfg.globalRanks.size()) == cfg.worldSize;
    return topologyFromSpec(spec, cfg.globalRanks, wholeWorld);
  }
  return topologyFromHostKeys(hostKeys);
}

int ranksOnThisMachine(const std::vector<std::string>& hostKeys, int myRank) {
  const std::string& mine = hostKeys[myRank];
  std::string suffix = mine.substr(mine.rfind('/'));  // "/<boot id>"
  int n = 0;
  for (const auto& k : hostKeys)
    if (k.size() >= suffix.size() &&
        k.compare(k.size() - suffix.size(), suffix.size(), suffix) == 0)
      ++n;
  return std::max(n, 1);
}

// Where the first rank whose collective failed the group (or that aborted
// it) records why; later ones name it in their errors.
const char* const kFirstFailureKey = "smdccl/first_failure";

// The recorded first failure, or "" while the group has none.
std::string recordedFirstFailure(KVStore& store) {
  if (!store.check(kFirstFailureKey)) return "";
  return store.get(kFirstFailureKey, Deadline::after(std::chrono::seconds(5)));
}

// MeshConfig::groupFailed: the recorded first failure, read from the store
// at most twice a second (it is asked on every slice of a connection wait).
class GroupFailureProbe {
 public:
  explicit GroupFailureProbe(std::shared_ptr<KVStore> store) : store_(std::move(store)) {}

  std::string operator()() {
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

 private:
  std::shared_ptr<KVStore> store_;
  std::mutex mu_;
  std::chrono::steady_clock::time_point next_{};
  std::chrono::milliseconds interval_{500};
  std::string found_;
};

// The keys of this incarnation of the group. A group re-created under the
// same name on a store that outlived the first one (destroy_process_group()
// then init_process_group() on torchrun's agent store, or on a store the
// caller passes again) would otherwise read the earlier one's keys: its
// token, addresses, shared-memory names, recorded failure. Each rank counts
// its joins of groups with this name and these members (torch reuses names,
// also for other members or sizes); the count is the incarnation's prefix,
// the same on its ranks as each of them joins each incarnation once.
c10::intrusive_ptr<::c10d::Store> incarnationStore(const c10::intrusive_ptr<::c10d::Store>& store,
                                                   const BackendConfig& cfg) {
  Fnv1a members;  // of the members' global ranks
  members.mix(static_cast<uint64_t>(cfg.size));
  for (int r = 0; r < cfg.size; ++r)
    members.mix(static_cast<uint64_t>(
        cfg.globalRanks.empty() ? r : cfg.globalRanks[static_cast<size_t>(r)]));
  char tag[17];
  std::snprintf(tag, sizeof tag, "%016llx", static_cast<unsigned long long>(members.value));
  int64_t joined = store->add(strCat("smdccl/joined/", tag, "/", cfg.rank), 1);
  return c10::make_intrusive<::c10d::PrefixStore>(strCat("smdccl/", tag, "/", joined - 1), store);
}

}  // namespace

SmdcclBackend::SmdcclBackend(c10::intrusive_ptr<::c10d::Store> store, BackendConfig cfg)
    : ::c10d::Backend(cfg.rank, cfg.size),
      cfg_(std::move(cfg)),
      c10dStore_(incarnationStore(store, cfg_)),
      store_(std::make_shared<C10dStoreAdapter>(c10dStore_)),
      timeoutMs_(cfg_.timeout.count()) {
  if (cfg_.globalRanks.empty())
    for (int r = 0; r < cfg_.size; ++r) cfg_.globalRanks.push_back(r);
  if (cfg_.worldSize <= 0) cfg_.worldSize = cfg_.size;
  setLogRank(cfg_.globalRanks[cfg_.rank]);
  trace::setRank(cfg_.globalRanks[cfg_.rank]);
  tuning_ = Tuning::fromEnv();
  fusionBytes_ = static_cast<size_t>(envInt(env::kFusionMB)) << 20;  // range-checked: 0..1024
  nanCheck_ = envInt(env::kNanCheck) != 0;
  if (nanCheck_) fusionBytes_ = 0;  // each allreduce's inputs are checked on their own
  detailChecks_ = logEnabled(LogLevel::Detail) || torchDebugDetail();
  Deadline deadline = Deadline::after(cfg_.timeout);

  MeshConfig mc;
  mc.rank = cfg_.rank;
  mc.size = cfg_.size;
  std::vector<std::string> hostKeys = gatherHostKeys(*store_, cfg_, deadline);
  mc.topology = buildTopology(hostKeys, cfg_);
  mc.masterAddr = cfg_.masterAddr;
  mc.shmRingBytes = static_cast<size_t>(envInt(env::kShmRingKB)) << 10;
  mc.groupFailed = [probe = std::make_shared<GroupFailureProbe>(store_)] { return (*probe)(); };
  mesh_ = std::make_unique<Mesh>(*store_, mc, deadline);
  ring_ = mc.topology.ringOrder();
  levels_ = hierarchyOf(mc.topology, cfg_.rank);
  p2p_ = std::make_unique<P2PEngine>(
      *mesh_, cfg_.groupName, [this] { return std::chrono::milliseconds(timeoutMs_.load()); },
      envDouble(env::kWarnAfter));
  int machineRanks = ranksOnThisMachine(hostKeys, cfg_.rank);
  waitPolicy_ = pickWaitPolicy(machineRanks);
  deviceOps_ =
      makeDeviceOps(*store_, [this] { return std::chrono::milliseconds(timeoutMs_.load()); });
  progress_ = std::make_unique<ProgressThread>(pickIdleSpin(machineRanks));
  watchdog_ = std::make_unique<Watchdog>(store_, cfg_.rank, cfg_.size, cfg_.groupName,
                                         envDouble(env::kWarnAfter));
  SMDCCL_INFO("group '", cfg_.groupName, "' rank ", cfg_.rank, "/", cfg_.size, ": ",
              mc.topology.describe(), "; ", machineRanks, " ranks share this machine's ",
              usableCores(), " cores; spin ", waitPolicy_.spinUs, " us, yield ",
              waitPolicy_.yieldUs, " us; cost model: ", tuning_.model.describe());
}

SmdcclBackend::~SmdcclBackend() {
  // The progress and send/recv threads may be dropping the last reference to
  // a Work whose tensors are Python's (that takes the GIL): join them without it.
  GilReleasedIfHeld released;
  // Finishes queued work first, with progress_ still set: a task that fails
  // calls failGroup, which stops the thread through it (reset() alone would
  // null the pointer before joining: a crash on a group destroyed with a
  // collective still pending).
  progress_->finish();
  progress_.reset();
  watchdog_.reset();
  p2p_.reset();
  mesh_.reset();
  // Here, without the GIL: the CUDA IPC buffers wait (a store round) until
  // every node-mate has unmapped them.
  deviceOps_.reset();
  trace::flush();
}

c10::intrusive_ptr<::c10d::Backend::Options> SmdcclBackend::getBackendOptions() {
  auto o = c10::make_intrusive<Options>("smdccl", std::chrono::milliseconds(timeoutMs_.load()));
  o->group_name = cfg_.groupName;
  for (int g : cfg_.globalRanks) o->global_ranks_in_group.push_back(static_cast<uint64_t>(g));
  return o;
}

std::chrono::milliseconds SmdcclBackend::effectiveTimeout(std::chrono::milliseconds op) const {
  if (op > std::chrono::milliseconds(0)) return op;
  return std::chrono::milliseconds(timeoutMs_.load());
}

c10::intrusive_ptr<::c10d::Work> SmdcclBackend::enqueue(
    ::c10d::OpType type, const char* name, OpCall call, std::vector<at::Tensor> outputs,
    std::function<void(Comm&)> body, std::chrono::milliseconds opTimeout, bool asyncOp,
    std::shared_ptr<QueuedAllreduce> fusable, std::shared_ptr<DeviceOp> device) {
  seq_.fetch_add(1);
  auto number = std::make_shared<std::atomic<uint64_t>>(0);
  auto what = [name, number, group = cfg_.groupName] {
    uint64_t n = number->load();
    return n ? strCat(name, " #", n, " on group '", group, "'")
             : strCat(name, " (queued, not started) on group '", group, "'");
  };
  auto work = c10::make_intrusive<SmdcclWork>(rank_, type, std::move(outputs), what);
  work->setRunner(progress_->key());
  if (fusable) {
    fusable->work = work;
    fusable->number = number;
  }
  auto timeout = effectiveTimeout(opTimeout);
  if (device) work->setDeviceCompletion(device->completion(what, timeout));
  call.sig.name = name;
  // CPU and CUDA tensors may take different paths (allreduce): under the
  // full fingerprint a CPU rank and a CUDA rank of one call do not match.
  if (device && call.sig.shapeHash)
    call.sig.shapeHash = (call.sig.shapeHash ^ 1) * 1099511628211ull;
  int64_t queued = trace::enabled() ? trace::nowUs() : 0;
  // Issued by a completion callback, on the progress thread itself: DDP's
  // PowerSGD hook all_reduces in its future callbacks and waits for the
  // result there. Queued, the op would wait behind the very task that waits
  // for it, for ever. It runs here, at once, ahead of what is queued: on
  // every rank at the same point of the run order (right after the op whose
  // completion issued it), whatever the caller threads queued meanwhile.
  if (progress_->runningHere()) {
    runWork(*work, call, body, *number, name, timeout, queued, device.get());
    return work;
  }
  // A blocking call (async_op=False) with nothing ahead of it runs right here.
  if (!asyncOp && progress_->tryRunInline([&] {
        runWork(*work, call, body, *number, name, timeout, queued, device.get());
      }))
    return work;
  auto task = [this, work, call = std::move(call), body = std::move(body), number, name, timeout,
               queued, device] {
    runWork(*work, call, body, *number, name, timeout, queued, device.get());
  };
  // The thread has stopped after a failure: runWork fails the work at once
  // with the group's cause, here.
  if (!progress_->post(task, std::move(fusable))) task();
  return work;
}

}  // namespace smdccl

namespace smdccl {

std::string SmdcclBackend::failureWithGroupCause(const std::string& mine) {
  const std::string key = kFirstFailureKey;
  try {
    std::string recorded = recordedFirstFailure(*store_);
    if (!recorded.empty())
      return recorded == mine ? mine : mine + " [first failure in the group: " + recorded + "]";
    if (store_->add(key + "/claim", 1) == 1) {
      store_->set(key, mine);
    } else {
      // Another rank is writing its cause right now.
      std::string first = store_->get(key, Deadline::after(std::chrono::seconds(5)));
      return mine + " [first failure in the group: " + first + "]";
    }
  } catch (const std::exception& e) {
    SMDCCL_INFO("could not share the failure cause through the store: ", e.what());
  }
  return mine;
}

void SmdcclBackend::checkFinite(Comm& c, const std::vector<at::Tensor>& inputs) {
  std::string mine;
  for (size_t i = 0; i < inputs.size() && mine.empty(); ++i) {
    std::string report = nonFiniteReport(inputs[i]);
    if (!report.empty()) mine = strCat("input ", i, " has ", report);
  }
  // flags[r] = 1: rank r's inputs are not finite. Every rank takes part, also
  // ranks whose inputs are not sent (a broadcast's non-roots).
  std::vector<uint8_t> flags(static_cast<size_t>(c.size()), 0);
  flags[static_cast<size_t>(c.rank())] = mine.empty() ? 0 : 1;
  recursiveDoublingAllreduce(c, reinterpret_cast<char*>(flags.data()), flags.size(), DType::U8,
                             RedOp::Max);
  std::string who;
  for (int r = 0; r < c.size(); ++r)
    if (flags[static_cast<size_t>(r)]) who += strCat(who.empty() ? "" : ", ", r);
  if (who.empty()) return;
  std::string msg = strCat("smdccl: ", c.ctx.describe(), ": SMDCCL_NAN_CHECK: NaN or Inf in the ",
                           "input of rank(s) ", who);
  if (!mine.empty()) msg += strCat("; on this rank ", mine);
  SMDCCL_WARN(msg);
  throw InvalidArgument(msg + ". The collective did not run.");
}

void SmdcclBackend::checkRankOfGroup(const char* api, int64_t r) const {
  SMDCCL_CHECK_ARG(r >= 0 && r < size_, api, ": rank ", r, " is not a rank of group '",
                   cfg_.groupName, "' (its ranks are 0..", size_ - 1, ")");
}

BackendConfig SmdcclBackend::childConfig(const std::vector<int>& ranks, std::string name,
                                         const c10::intrusive_ptr<Options>& opts) const {
  BackendConfig child;
  child.rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), rank_) - ranks.begin());
  child.size = static_cast<int>(ranks.size());
  child.groupName = std::move(name);
  for (int r : ranks) child.globalRanks.push_back(cfg_.globalRanks[r]);
  child.timeout = opts && opts->timeout.count() > 0 ? opts->timeout
                                                    : std::chrono::milliseconds(timeoutMs_.load());
  child.masterAddr = cfg_.masterAddr;
  child.worldSize = cfg_.worldSize;
  child.wire = cfg_.wire;
  child.wireIntra = cfg_.wireIntra;
  return child;
}

c10::intrusive_ptr<::c10d::Backend> SmdcclBackend::split(
    const c10::intrusive_ptr<::c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  std::vector<int> seen;
  for (int r : ranks) {
    checkRankOfGroup("split_group", r);
    SMDCCL_CHECK_ARG(std::find(seen.begin(), seen.end(), r) == seen.end(), "split_group: rank ", r,
                     " is listed twice");
    seen.push_back(r);
  }
  auto mine = std::find(ranks.begin(), ranks.end(), rank_);
  if (mine == ranks.end()) return {};  // not a member: torch returns NON_GROUP_MEMBER
  {
    std::lock_guard<std::mutex> lock(splitMu_);
    // The same child for each device type of one split (same store object);
    // a child that is gone no longer holds its store, whose address may be reused.
    for (auto& [s, weak] : splitChildren_)
      if (s == store.get())
        if (auto child = weak.lock()) return child;
    splitChildren_.erase(std::remove_if(splitChildren_.begin(), splitChildren_.end(),
                                        [](const auto& e) { return e.second.expired(); }),
                         splitChildren_.end());
  }
  BackendConfig child =
      childConfig(ranks,
                  opts && !opts->group_name.empty()
                      ? opts->group_name
                      : strCat(cfg_.groupName, ":split:", ranks.size(), "@", ranks.front()),
                  opts);
  c10::intrusive_ptr<SmdcclBackend> backend;
  {
    GilReleasedIfHeld released;  // construction rendezvouses through the store
    backend = c10::make_intrusive<SmdcclBackend>(store, std::move(child));
  }
  std::lock_guard<std::mutex> lock(splitMu_);
  splitChildren_.emplace_back(store.get(), c10::weak_intrusive_ptr<SmdcclBackend>(backend));
  return backend;
}

c10::intrusive_ptr<::c10d::Backend> SmdcclBackend::shrink(
    const std::vector<int64_t>& ranksToExclude, int shrinkFlags,
    const c10::intrusive_ptr<Options>& opts) {
  constexpr int kShrinkAbort = 1;  // torch.distributed.SHRINK_ABORT
  SMDCCL_CHECK_ARG(shrinkFlags == 0 || shrinkFlags == kShrinkAbort, "shrink_group: shrink_flags ",
                   shrinkFlags, " is neither SHRINK_DEFAULT (0) nor SHRINK_ABORT (1)");
  std::vector<bool> excluded(static_cast<size_t>(size_), false);
  for (int64_t r : ranksToExclude) {
    checkRankOfGroup("shrink_group", r);
    excluded[static_cast<size_t>(r)] = true;
  }
  SMDCCL_CHECK_ARG(!excluded[static_cast<size_t>(rank_)], "shrink_group: rank ", rank_,
                   " is one of the ranks to exclude; only the remaining ranks call shrink_group");
  std::vector<int> remaining;
  for (int r = 0; r < size_; ++r)
    if (!excluded[static_cast<size_t>(r)]) remaining.push_back(r);
  uint64_t n = ++shrinks_;
  BackendConfig child = childConfig(remaining,
                                    opts && !opts->group_name.empty()
                                        ? opts->group_name
                                        : strCat(cfg_.groupName, ":shrunk", n > 1 ? strCat(n) : ""),
                                    opts);
  if (shrinkFlags == kShrinkAbort) abort();
  auto store = c10::make_intrusive<::c10d::PrefixStore>(strCat("smdccl/shrink/", n), c10dStore_);
  GilReleasedIfHeld released;  // construction rendezvouses through the store
  return c10::make_intrusive<SmdcclBackend>(store, std::move(child));
}

void SmdcclBackend::monitoredBarrier(const ::c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Also after the group failed or was aborted (when one most wants to know
  // who is where): it needs only the store.
  MonitoredBarrierCall call;
  call.rank = rank_;
  call.size = size_;
  call.seq = ++monitoredBarriers_;
  // torch's unset timeout is -1; a zero one is a deadline already passed
  // (gloo reports at once), not "the group's timeout": that waited forever
  // for a rank that never comes.
  call.timeout = opts.timeout == ::c10d::kUnsetTimeout
                     ? std::chrono::milliseconds(timeoutMs_.load())
                     : std::max(opts.timeout, std::chrono::milliseconds(0));
  call.waitAllRanks = waitAllRanks;
  call.group = cfg_.groupName;
  GilReleasedIfHeld released;  // it waits for other processes
  try {
    // 2 s for the late ranks' watchdogs to answer (they look every 0.5 s),
    // well within verdictGrace.
    smdccl::monitoredBarrier(*store_, call, [this](const std::vector<int>& late) {
      return watchdog_->describeRanks(late, std::chrono::seconds(2));
    });
  } catch (...) { std::rethrow_exception(toTorchError(std::current_exception())); }
}

::c10d::ErrorType SmdcclBackend::getError() {
  std::lock_guard<std::mutex> lock(fatalMu_);
  return errorType_;
}

void SmdcclBackend::abort() {
  std::string cause = strCat("smdccl: group '", cfg_.groupName, "' was aborted on rank ", rank_,
                             " (ProcessGroup.abort())");
  auto err = toTorchError(std::make_exception_ptr(CommError(CommError::Kind::System, cause)));
  {
    std::lock_guard<std::mutex> lock(fatalMu_);
    if (!abortCause_.empty()) return;
    abortCause_ = cause;
    if (!fatal_) {  // an earlier failure stays the group's cause
      fatal_ = err;
      errorType_ = ::c10d::ErrorType::COMM_ERROR;
    }
  }
  SMDCCL_WARN(cause);
  p2p_->abort(err);      // first: a transfer that sees the cancel below reports this cause
  mesh_->cancelWaits();  // the op in flight stops at its next wait (Exchange, connection waits)
  // The rest belongs to the progress thread, once the op in flight has
  // stopped: this thread must not block on the store (abort() returns at
  // once, also with the store gone) nor touch the links the progress thread
  // may be connecting. It records the cause for the peers' errors first
  // (the op in flight may record it before, in failGroup: the first record
  // wins), then closes the links so that peers fail naming it.
  bool posted = progress_->post([this, cause] {
    failureWithGroupCause(cause);
    mesh_->abortLinks();
  });
  // A stopped thread: the group had failed before, its links are closed and
  // that failure is the recorded cause.
  if (!posted) mesh_->abortLinks();
  progress_->stopWhenIdle();  // what is queued fails at once
}

std::exception_ptr SmdcclBackend::failGroup(const OpContext& ctx, CommError::Kind kind,
                                            const std::string& cause) {
  std::string aborted;
  {
    std::lock_guard<std::mutex> lock(fatalMu_);
    aborted = abortCause_;
  }
  if (!aborted.empty()) {
    // Interrupted by abort(): that is the cause, whatever the wait saw.
    std::string msg = strCat(aborted, " while in ", ctx.describe());
    failureWithGroupCause(msg);  // peers name it...
    mesh_->abortLinks();         // ...once they see the links close
    return toTorchError(std::make_exception_ptr(CommError(kind, msg)));
  }
  // Exchange names the op; a failure outside it (e.g. connecting a link on
  // first use, an allocation) does not yet.
  std::string where = strCat("smdccl: ", ctx.describe());
  std::string what = cause.compare(0, where.size(), where) != 0 ? where + ": " + cause : cause;
  std::string msg = failureWithGroupCause(what);
  SMDCCL_WARN(msg);
  mesh_->abortLinks();  // only after the cause is in the store
  std::exception_ptr err = toTorchError(std::make_exception_ptr(CommError(kind, msg)));
  {
    std::lock_guard<std::mutex> lock(fatalMu_);
    fatal_ = err;
    errorType_ = kind == CommError::Kind::Timeout       ? ::c10d::ErrorType::TIMEOUT
                 : kind == CommError::Kind::PeerFailure ? ::c10d::ErrorType::REMOTE_ERROR
                                                        : ::c10d::ErrorType::COMM_ERROR;
  }
  // Nothing can run on this group any more: what is queued fails fast,
  // then the thread exits; later calls fail on the caller's thread.
  progress_->stopWhenIdle();
  return err;
}

void SmdcclBackend::runWork(SmdcclWork& work, const OpCall& call,
                            const std::function<void(Comm&)>& body, std::atomic<uint64_t>& number,
                            const char* name, std::chrono::milliseconds timeout, int64_t queuedUs,
                            DeviceOp* device) {
  const uint64_t seq = ++runSeq_;
  number.store(seq);
  // CUDA: tensor ops of the body (scaling, copies) run on the internal
  // stream, and the work's future completes there.
  std::optional<c10::StreamGuard> onStream;
  if (device) onStream.emplace(device->stream());
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(fatalMu_);
    err = fatal_;
  }
  if (err) {
    // Streams between ranks are out of step after a failure: fail fast.
    if (device) device->signal(seq);
    work.complete(err);
    return;
  }
  work.markStarted();
  watchdog_->opStarted(seq, name);
  riders_.clear();
  riderDevices_.clear();
  OpContext ctx;
  ctx.op = name;
  ctx.group = &cfg_.groupName;
  ctx.rank = rank_;
  ctx.seq = seq;
  ctx.deadline = Deadline::after(timeout);
  ctx.wait = waitPolicy_;
  ctx.sig = call.sig;
  ctx.compareShapes = detailChecks_;
  ctx.cancel = mesh_->cancelFlag();
  Comm c{*mesh_, ctx, ring_, &levels_, /*members: the whole group*/ {}};
  c.book = &exchangeBook_;
  const std::string& track = cfg_.groupName;
  if (queuedUs) {
    int64_t now = trace::nowUs();
    trace::record(strCat(name, " #", seq, " queued"), "queue", track, queuedUs, now - queuedUs);
  }
  const bool tracing = trace::enabled();
  trace::Span span(
      tracing ? strCat(name, " #", seq) : std::string(), "collective", track,
      tracing ? strCat("\"seq\":", seq, ",\"call\":\"", call.sig.describe(), "\"") : std::string());
  const bool timing = logEnabled(LogLevel::Trace);
  auto started =
      timing ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  try {
    if (device) device->prepare(ctx);
    if (detailChecks_) {
      trace::Span phase("fingerprint (DETAIL)", "check", track);
      // Full fingerprint: an empty direct allgather puts this op's header
      // on every link, so every rank compares its call with every other's.
      directAllgather(c, nullptr, Blocks::fromLengths(std::vector<size_t>(size_, 0)));
    }
    if (nanCheck_ && call.sig.dtype >= 0) {
      trace::Span phase("NaN/Inf check", "check", track);
      checkFinite(c, call.inputs);
    }
    body(c);
    if (device) device->finishBody(ctx);
  } catch (const InvalidArgument&) {  // the ranks agreed on it (the NaN check): the group goes on
    err = toTorchError(std::current_exception());
  } catch (const c10::ValueError&) {  // likewise (the fp16 overflow check)
    err = toTorchError(std::current_exception());
  } catch (const CommError& e) {
    err = failGroup(ctx, e.kind(), e.what());
  } catch (const c10::Error& e) {
    // This rank alone (out of memory, ...): its peers would wait for it
    // until their deadline. Failing the group tells them at once.
    err = failGroup(ctx, CommError::Kind::System, e.what_without_backtrace());
  } catch (const std::exception& e) {
    err = failGroup(ctx, CommError::Kind::System, e.what());
  } catch (...) { err = failGroup(ctx, CommError::Kind::System, "an exception of unknown type"); }
  watchdog_->opFinished(seq);
  if (timing)
    SMDCCL_TRACE(ctx.describe(), " ", call.sig.describe(), ": ",
                 std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now() - started)
                     .count(),
                 " us", riders_.empty() ? "" : strCat(" (", riders_.size(), " fused in)"),
                 err ? " (failed)" : "");
  // Allreduces fused into this one complete with its outcome, after it: in
  // issue order, so that ops their callbacks run right here (enqueue) come
  // in the same order on every rank, whether a rank's callbacks were attached
  // before completion (run here) or after (run by the caller, queued).
  // Moved out first: those ops run runWork again.
  std::vector<c10::intrusive_ptr<SmdcclWork>> riders;
  riders.swap(riders_);
  if (device) device->signal(seq);
  for (auto& [d, riderSeq] : riderDevices_) d->signal(riderSeq);
  riderDevices_.clear();
  work.complete(err);
  for (auto& w : riders) w->complete(err);
  dropOrLeak(riders);
}

}  // namespace smdccl
