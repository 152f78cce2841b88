#pragma once
// The flag matrix of a node's stream barriers (algorithms/stream_barrier.h),
// in a shared-memory segment that every rank of the node maps, and that each
// may make visible to its GPU (`attach`). Collective over the node's ranks.
#include <functional>
#include <string>

#include "algorithms/stream_barrier.h"
#include "common/store.h"
#include "transport/shm_segment.h"

namespace smdccl {

class NodeFlags {
 public:
  struct Spec {
    std::string keyPrefix;  // where the rounds meet in the store
    int localRank;
    int localSize;
    // Run on the mapped segment by every rank: "" when it can use it (e.g.
    // its GPU could map it), else why not. May be empty (always usable).
    std::function<std::string(char* base, size_t bytes)> attach;
    // Undoes a successful attach: before the segment is unmapped, and at
    // once when the flags are unusable on the node. May be empty.
    std::function<void(char* base)> detach;
  };
  // Local rank 0 creates the segment (zero-filled: every epoch starts at 0)
  // and names it in the store; the others open it; then all tell each other
  // whether `attach` worked, and the name is unlinked.
  NodeFlags(KVStore& store, const Spec& s, Deadline deadline);
  ~NodeFlags();
  NodeFlags(const NodeFlags&) = delete;
  NodeFlags& operator=(const NodeFlags&) = delete;
  // The GPU may still read the flags (its stream never drained): leaves the
  // segment mapped and attached for the life of the process.
  void keepMapped();

  FlagMatrix matrix() const { return {segment_.data(), localSize_}; }
  // Every rank of the node attached: the flags may be used.
  bool usable() const { return why_.empty(); }
  // Why not: "local rank 1: <its reason>".
  const std::string& why() const { return why_; }
  char* base() const { return segment_.data(); }
  size_t bytes() const { return segment_.size(); }

 private:
  void detach();

  int localSize_;
  std::function<void(char*)> detach_;
  ShmSegment segment_;
  bool attached_ = false;
  ShmSegment* leaked_ = nullptr;  // keepMapped(): never unmapped
  std::string why_;
};

}  // namespace smdccl
