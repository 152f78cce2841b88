// The intra-node engine choice for CUDA tensors (algorithms/intra_engine.h)
// and the NCCL loader's error paths (transport/nccl_library.h), without a
// GPU. The loader's success path: tests/test_nccl_engine.py (torch's NCCL).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/intra_engine.h"
#include "check.h"
#include "common/error.h"
#include "memory_store.h"
#include "transport/nccl_library.h"

using namespace smdccl;

namespace {
IntraRank gpu(const char* bus, bool nccl = true) {
  return {bus, nccl, nccl ? "" : "cannot load libnccl.so.2: not found"};
}
}  // namespace

TEST(intra_engine_auto_takes_nccl_only_with_a_gpu_per_rank) {
  IntraChoice own = chooseIntraEngine("auto", {gpu("0000:07:00.0"), gpu("0000:0f:00.0")});
  CHECK(own.engine == IntraEngine::Nccl);
  CHECK(own.why == "every rank of the node has a GPU of its own");
  IntraChoice shared = chooseIntraEngine(
      "auto", {gpu("0000:07:00.0"), gpu("0000:07:00.0"), gpu("0000:0f:00.0")});
  CHECK(shared.engine == IntraEngine::Ipc);
  CHECK(shared.why == "3 ranks share 2 GPUs (NCCL needs one GPU per rank)");
  IntraChoice missing = chooseIntraEngine("auto", {gpu("0000:07:00.0"), gpu("0000:0f:00.0", false)});
  CHECK(missing.engine == IntraEngine::Ipc);
  CHECK(missing.why == "local rank 1 cannot load NCCL: cannot load libnccl.so.2: not found");
}

TEST(intra_engine_forced_choices) {
  // ipc: whatever the ranks have; nccl: also on a shared GPU (NCCL accepts
  // that with NCCL_HOSTID per rank), but an error where NCCL is missing.
  CHECK(chooseIntraEngine("ipc", {gpu("a"), gpu("b")}).engine == IntraEngine::Ipc);
  CHECK(chooseIntraEngine("nccl", {gpu("a"), gpu("a")}).engine == IntraEngine::Nccl);
  std::string msg;
  try {
    chooseIntraEngine("nccl", {gpu("a"), gpu("b", false)});
  } catch (const InvalidArgument& e) { msg = e.what(); }
  CHECK(msg == "smdccl: SMDCCL_INTRA=nccl, but local rank 1 cannot load NCCL: cannot load "
               "libnccl.so.2: not found");
}

TEST(intra_engine_nodes_agree_on_one_engine) {
  // NCCL only where every node chose it: a node whose ranks share a GPU (or
  // lack NCCL) puts the whole group on the other paths, naming that node.
  const std::vector<IntraRank> own = {gpu("a"), gpu("b")}, shared = {gpu("c"), gpu("c")};
  IntraChoice both = chooseGroupEngine("auto", {own, own});
  CHECK(both.engine == IntraEngine::Nccl);
  CHECK(both.why == "every rank of every node has a GPU of its own");
  IntraChoice mixed = chooseGroupEngine("auto", {own, shared});
  CHECK(mixed.engine == IntraEngine::Ipc);
  CHECK(mixed.why == "node 1: 2 ranks share 1 GPU (NCCL needs one GPU per rank)");
  IntraChoice lacking = chooseGroupEngine("auto", {{gpu("a"), gpu("b", false)}, own});
  CHECK(lacking.engine == IntraEngine::Ipc);
  CHECK(lacking.why ==
        "node 0: local rank 1 cannot load NCCL: cannot load libnccl.so.2: not found");
  // One node: its own choice and words, as before.
  IntraChoice one = chooseGroupEngine("auto", {own});
  CHECK(one.engine == IntraEngine::Nccl &&
        one.why == "every rank of the node has a GPU of its own");
  // Forced: ipc everywhere; nccl everywhere, or an error on every rank.
  CHECK(chooseGroupEngine("ipc", {own, own}).engine == IntraEngine::Ipc);
  IntraChoice forced = chooseGroupEngine("nccl", {own, shared});
  CHECK(forced.engine == IntraEngine::Nccl && forced.why == "SMDCCL_INTRA=nccl");
  CHECK_THROWS(chooseGroupEngine("nccl", {own, {gpu("c"), gpu("d", false)}}), InvalidArgument);
}

TEST(intra_engine_reports_round_trip_through_the_store_format) {
  IntraRank r{"0000:07:00.0", false, "cannot load x|y: no"};
  IntraRank back = decodeIntraRank(encodeIntraRank(r));
  CHECK(back.gpu == r.gpu && back.ncclLoaded == r.ncclLoaded && back.ncclWhy == r.ncclWhy);
  CHECK_THROWS(decodeIntraRank("garbage"), InvalidArgument);
}

TEST(nccl_library_names_what_is_wrong_with_a_bad_library) {
  std::string why;
  CHECK(NcclLibrary::load("/nonexistent/libnccl.so.2", &why) == nullptr);
  CHECK(why.find("cannot load /nonexistent/libnccl.so.2") == 0);
  // A library that loads but is not NCCL: the missing entry points are named.
  CHECK(NcclLibrary::load("libm.so.6", &why) == nullptr);
  CHECK(why.find("libm.so.6 is not a usable NCCL (missing ncclGetVersion") == 0);
}

TEST(nccl_library_maps_types_and_ops) {
  int v = -1;
  CHECK(NcclLibrary::dataType(DType::F32, &v) && v == 7);
  CHECK(NcclLibrary::dataType(DType::F16, &v) && v == 6);
  CHECK(NcclLibrary::dataType(DType::I64, &v) && v == 4);
  CHECK(!NcclLibrary::dataType(DType::Bool, &v));
  CHECK(NcclLibrary::redOp(RedOp::Min, &v) && v == 3);
  CHECK(!NcclLibrary::redOp(RedOp::BXor, &v));
}

// With a real NCCL (tests/test_cpp_core.py passes torch's, where there is
// one): loaded, versioned, and a unique id that is not all zeros.
TEST(nccl_library_loads_torchs_nccl_where_there_is_one) {
  const char* path = std::getenv("SMDCCL_TEST_NCCL_LIBRARY");
  if (!path || !*path) return;
  std::string why;
  const NcclLibrary* lib = NcclLibrary::load(path, &why);
  CHECK(lib != nullptr);
  if (!lib) {
    std::fprintf(stderr, "  %s\n", why.c_str());
    return;
  }
  CHECK(lib->version() >= 21000);
  CHECK(lib->versionString().find("2.") == 0);
  NcclUniqueId id = lib->uniqueId();
  bool nonzero = false;
  for (char b : id.bytes) nonzero |= b != 0;
  CHECK(nonzero);
  // Through the store: rank 0's id reaches three other ranks (threads)
  // byte for byte; a rank whose rank 0 never publishes fails at its
  // deadline, naming the key.
  MemoryStore store;
  std::vector<NcclUniqueId> got(4);
  std::vector<std::thread> ranks;
  for (int r = 3; r >= 0; --r)
    ranks.emplace_back([&, r] {
      got[r] = shareNcclId(*lib, store, "node0/nccl_id", r, Deadline::after(std::chrono::seconds(10)));
    });
  for (auto& t : ranks) t.join();
  for (int r = 1; r < 4; ++r) CHECK(std::memcmp(got[r].bytes, got[0].bytes, 128) == 0);
  CHECK(std::memcmp(decodeNcclId(encodeNcclId(got[0])).bytes, got[0].bytes, 128) == 0);
  std::string msg;
  try {
    shareNcclId(*lib, store, "node1/nccl_id", 1, Deadline::after(std::chrono::milliseconds(50)));
  } catch (const CommError& e) { msg = e.what(); }
  CHECK(msg.find("node1/nccl_id") != std::string::npos);
  CHECK_THROWS(decodeNcclId(std::string(256, 'z')), InvalidArgument);
}
