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
#include "backend/group_failure.h"
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
SMDCCL_ENV_INT(kP2PShm, "SMDCCL_P2P_SHM", 1, 0, 1,
               "send/recv to a rank on the same node through shared memory (a ring of "
               "SMDCCL_SHM_RING_KB per direction); 0: over TCP loopback. The sender chooses, so "
               "ranks may differ.");
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
    return allGatherStrings(store, {"smdccl/host", cfg.rank, cfg.size, deadline}, hostKey());
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
  nanCheck_ = envInt(env::kNanCheck) != 0;
  detailChecks_ = logEnabled(LogLevel::Detail) || torchDebugDetail();
  Deadline deadline = Deadline::after(cfg_.timeout);

  MeshConfig mc;
  mc.rank = cfg_.rank;
  mc.size = cfg_.size;
  std::vector<std::string> hostKeys = gatherHostKeys(*store_, cfg_, deadline);
  mc.topology = buildTopology(hostKeys, cfg_);
  mc.masterAddr = cfg_.masterAddr;
  mc.shmRingBytes = static_cast<size_t>(envInt(env::kShmRingKB)) << 10;
  mc.p2pByShm = envInt(env::kP2PShm) != 0;
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
  deviceOps_->onDeviceFailure([this](const std::string& cause) { failFromDevice(cause); });
  progress_ = std::make_unique<ProgressThread>(pickIdleSpin(machineRanks));
  // Under SMDCCL_NAN_CHECK each allreduce's inputs are checked on their own: no fusion.
  size_t fusionBytes = static_cast<size_t>(envInt(env::kFusionMB)) << 20;  // range-checked
  fusion_ = std::make_unique<AllreduceFusion>(*progress_, nanCheck_ ? 0 : fusionBytes);
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
  // From here a late GPU failure concerns nobody (waits for a call in progress).
  deviceOps_->onDeviceFailure(nullptr);
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

bool SmdcclBackend::compressesSomeHop() const {
  Comm c{*mesh_, OpContext{}, ring_, &levels_, /*members: the whole group*/ {}};
  return reduce_.compressesSomeHop(c);
}

std::chrono::milliseconds SmdcclBackend::effectiveTimeout(std::chrono::milliseconds op) const {
  if (op > std::chrono::milliseconds(0)) return op;
  return std::chrono::milliseconds(timeoutMs_.load());
}

}  // namespace smdccl
