#pragma once
// Which engine moves CUDA tensors between the ranks of one node:
//  - NCCL, the vendor's engine for NVLink / PCIe, where every rank of the
//    node has a GPU of its own (NCCL refuses two ranks on one GPU) and every
//    rank could load it;
//  - smdccl's own CUDA-IPC kernels, which also serve ranks sharing a GPU,
//    and are the fallback.
// SMDCCL_INTRA picks: auto (the above), nccl or ipc (forced). Decided from
// what every rank of the group reported, so all of them decide alike.
// Pure: unit-tested without a GPU.
#include <string>
#include <vector>

namespace smdccl {

enum class IntraEngine { Ipc, Nccl };
const char* intraEngineName(IntraEngine e);

// What one rank of the node reports.
struct IntraRank {
  std::string gpu;          // the physical GPU (its PCI bus id)
  bool ncclLoaded = false;  // whether this rank could load NCCL
  std::string ncclWhy;      // why not, when it could not
};

struct IntraChoice {
  IntraEngine engine = IntraEngine::Ipc;
  std::string why;  // for the INFO log and smdccl.info: what decided it
};

// `setting`: SMDCCL_INTRA ("auto", "nccl", "ipc"); `ranks`: the node's, by
// local rank. Forcing NCCL where some rank cannot load it throws
// InvalidArgument naming that rank and why (a user who asked for NCCL gets
// an error, not a silent fallback).
IntraChoice chooseIntraEngine(const std::string& setting, const std::vector<IntraRank>& ranks);
// The group's engine: every node's choice (`nodes`: each node's ranks, by
// node), NCCL only where every node chose it. The paths across nodes take
// each node's share in one schedule (NCCL's blocks, or the whole tensor
// staged): a node on NCCL beside one on the IPC kernels would run
// different collectives and wait on each other.
IntraChoice chooseGroupEngine(const std::string& setting,
                              const std::vector<std::vector<IntraRank>>& nodes);

// One rank's report as a store value, and back.
std::string encodeIntraRank(const IntraRank& r);
IntraRank decodeIntraRank(const std::string& s);

}  // namespace smdccl
