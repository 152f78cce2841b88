#pragma once
// Collectives on device memory. Each enqueues its GPU work on the context's
// stream, moves data between ranks inside a node with NCCL (every rank its
// own GPU) or over CUDA IPC (ranks sharing a GPU), and between nodes
// through pinned host memory over the host transports. The path is chosen
// among the registered CUDA paths (algorithms/gpu_paths.h).
#include "algorithms/comm.h"
#include "algorithms/cuda/gpu_context.h"
#include "algorithms/tuning.h"

namespace smdccl {

// In place on a.buf (a.count elements of a.dt, a.op), over the whole group c.
void gpuAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// a.count a.dt elements at a.buf reduced with a.op into group rank
// a.root's a.buf (elsewhere a.buf is scratch): NCCL's reduce on one node
// where NCCL runs there, the allreduce otherwise.
void gpuReduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// Reduce-scatter of device memory over the group c: r.in holds c.size()
// blocks of `each` elements (block r is rank r's), `out` (each elements)
// receives this rank's block reduced over every rank; `in` is left as it was.
void gpuReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t);
// Allgather of device memory: `in` (eachBytes) goes to block c.rank() of
// `out` (c.size() blocks), every other rank's into its block. `in` may be
// `out`'s own block.
void gpuAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t);
// In place: a.bytes at device address a.buf from group rank a.root to every rank.
void gpuBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);

// What each path of algorithms/gpu_paths.h runs (gpu_registry.cpp maps
// the chosen path's name to these).
// staged (gpu_staged.cpp): the rounds of algorithms/staged_collectives.h
// through the group's pinned slots; the NCCL path runs them across nodes
// too.
void stagedAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
void stagedReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t);
void stagedAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t);
void stagedBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
// nccl (gpu_nccl.cpp): one node, NCCL's collective; several, NCCL's
// reduce-scatter in the node, the staged allreduce of this rank's block
// across nodes, NCCL's allgather; reduce-scatter, allgather and broadcast
// as algorithms/node_then_across.h schedules them.
void ncclAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
void ncclReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r, const Tuning& t);
void ncclAllgather(Comm& c, GpuContext& g, const BlockGather& b, const Tuning& t);
void ncclBroadcast(Comm& c, GpuContext& g, const CollectiveArgs& a, const Tuning& t);
void ncclReduce(Comm& c, GpuContext& g, const CollectiveArgs& a);  // one node
// ipc (gpu_ipc.cpp): one node, over its IPC buffers (in pieces of a buffer).
void ipcAllreduce(Comm& c, GpuContext& g, const CollectiveArgs& a);
void ipcReduceScatter(Comm& c, GpuContext& g, const BlockReduction& r);
void ipcAllgather(Comm& c, GpuContext& g, const BlockGather& b);

}  // namespace smdccl
