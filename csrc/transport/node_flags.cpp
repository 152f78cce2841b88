#include "transport/node_flags.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>

#include "common/error.h"

namespace smdccl {

namespace {
constexpr char kFailed = '!';
std::atomic<int> segmentsMade{0};
}  // namespace

NodeFlags::NodeFlags(KVStore& store, const Spec& s, Deadline deadline)
    : localSize_(s.localSize), detach_(s.detach) {
  constexpr size_t kPage = 4096;  // whole pages: what cudaHostRegister maps
  const size_t bytes = (FlagMatrix::bytesFor(s.localSize) + kPage - 1) / kPage * kPage;
  std::string name;
  if (s.localRank == 0) {
    name = strCat("/smdccl-flags-", getpid(), "-", segmentsMade.fetch_add(1));
    try {
      segment_ = ShmSegment::create(name, bytes);
    } catch (const std::exception& e) { name = strCat(kFailed, e.what()); }
  }
  auto unlinkMine = [&] {
    if (s.localRank == 0 && segment_.data()) ShmSegment::unlink(name);
  };
  // One store round of the node; when it fails, nothing is left behind:
  // the name unlinked, an attach undone before the segment is unmapped.
  auto round = [&](const char* step, const std::string& value) {
    try {
      return allGatherStrings(
          store, {strCat(s.keyPrefix, "/", step), s.localRank, s.localSize, deadline}, value);
    } catch (...) {
      unlinkMine();
      detach();
      throw;
    }
  };
  std::vector<std::string> names = round("name", name);
  const std::string& published = names[0];
  std::string mine;
  if (published.empty() || published[0] == kFailed) {
    mine = strCat("could not create the shared memory: ",
                  published.empty() ? std::string("no name published") : published.substr(1));
  } else {
    try {
      if (s.localRank != 0) segment_ = ShmSegment::open(published, bytes);
      if (s.attach) {
        mine = s.attach(segment_.data(), segment_.size());
        attached_ = mine.empty();
      }
    } catch (const std::exception& e) { mine = e.what(); }
  }
  std::vector<std::string> verdicts = round("attached", mine);
  unlinkMine();
  for (int l = 0; l < s.localSize && why_.empty(); ++l)
    if (!verdicts[static_cast<size_t>(l)].empty())
      why_ = strCat("local rank ", l, ": ", verdicts[static_cast<size_t>(l)]);
  if (!why_.empty()) detach();  // unusable: nobody will use what this rank attached
}

NodeFlags::~NodeFlags() { detach(); }

void NodeFlags::detach() {
  if (attached_ && detach_) detach_(segment_.data());
  attached_ = false;
}

void NodeFlags::keepMapped() {
  attached_ = false;
  leaked_ = new ShmSegment(std::move(segment_));
}

}  // namespace smdccl
