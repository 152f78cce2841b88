#pragma once
// Collectives on device memory. Each enqueues its GPU work on the context's
// stream, moves data between ranks over CUDA IPC (node-mates) and through
// pinned host memory over the host transports (other nodes), and returns
// once the result is in place (the stream has finished the op's work).
#include "algorithms/comm.h"
#include "algorithms/cuda/gpu_context.h"
#include "algorithms/select.h"

namespace smdccl {

// In place on a.buf (a.count elements of a.dt, a.op), over the whole group c:
//  - one node, several ranks: CUDA IPC, one-shot (every rank reduces all
//    peers' buffers) up to GpuTuning::oneShotBytes, two-shot (reduce-scatter
//    then allgather over the buffers) above;
//  - several nodes of the same size with node-mates: two levels, the IPC
//    reduce-scatter, the inter-node allreduce of each rank's slice through
//    pinned host memory (with the 16-bit wire when compression is on), the
//    IPC allgather;
//  - otherwise (one rank per node, uneven nodes, SMDCCL_CUDA_IPC=0): staged
//    through pinned host memory in chunks, copies overlapping the network.
void gpuAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// The staged path alone: chunk k's device-to-host copy, chunk k-1's host
// allreduce and chunk k-2's copy back overlap, through a few chunk-sized
// pinned buffers reused in turn (not a pinned copy of the whole tensor).
void stagedAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// Which path gpuAllreduce takes, for logs and tests: "nccl", "two-level
// nccl + staged", "ipc one-shot", "ipc two-shot", "two-level ipc + staged",
// "staged".
const char* gpuAllreducePath(const Comm& c, GpuContext& g, const CollectiveArgs& a);

// NCCL inside the node (gpu_nccl.cpp): whether the group's CUDA
// collectives of dt/op run on it here (c the whole group, nodes of equal
// size with several ranks, SMDCCL_CUDA_IPC=1, NCCL chosen for the node:
// GpuContext::intra, decided with the node's ranks at the first call).
bool ncclIntraUsable(const Comm& c, GpuContext& g, DType dt, RedOp op);
// One node: NCCL's allreduce. Several: NCCL's reduce-scatter in the node,
// the staged allreduce of this rank's block across nodes, NCCL's allgather.
void ncclAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// One node only: NCCL's reduce-scatter and allgather.
void ncclReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r);
void ncclAllgather(Comm& c, GpuContext& g, const BlockGather& b);

// Reduce-scatter of device memory over the group c: r.in holds c.size()
// blocks of `each` elements (block r is rank r's), `out` (each elements)
// receives this rank's block reduced over every rank; `in` is left as it
// was. One node with node-mates: CUDA IPC (each rank stages all blocks in
// its buffer, then reduces its own block from every buffer in one pass).
// Otherwise staged through pinned host memory (the host reduce-scatter,
// with the 16-bit wire when compression is on).
void gpuReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t);
// Allgather of device memory: `in` (eachBytes) goes to block c.rank() of
// `out` (c.size() blocks), every other rank's into its block. One node with
// node-mates: CUDA IPC (each rank stages its block, then copies every
// peer's); otherwise staged through pinned host memory. `in` may be
// `out`'s own block.
void gpuAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t);
// Which path those two take: "nccl", "ipc" or "staged".
const char* gpuScatterGatherPath(const Comm& c, GpuContext& g, DType dt, RedOp op);

}  // namespace smdccl
