#pragma once
// Which engine moves CUDA tensors between the ranks of one node:
//  - NCCL, the vendor's engine for NVLink / PCIe, where every rank of the
//    node has a GPU of its own (NCCL refuses two ranks on one GPU) and every
//    rank could load it;
//  - smdccl's own CUDA-IPC kernels, which also serve ranks sharing a GPU,
//    and are the fallback.
// SMDCCL_INTRA picks: auto (the above), nccl or ipc (forced). Decided from
// what every rank of the node reported, so all of them decide alike.
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

// One rank's report as a store value, and back.
std::string encodeIntraRank(const IntraRank& r);
IntraRank decodeIntraRank(const std::string& s);

}  // namespace smdccl
