#pragma once
// What a reduction means beyond moving data, for one group: which wire a
// float32 reduction crosses (SMDCCL_COMPRESSION, decided from the
// topology), AVG and PREMUL_SUM scaling around it (AVG divides before a
// 16-bit wire, whose range must hold the values, after the sum otherwise),
// and the fp16 overflow check. The collectives' bodies call it on the
// progress thread.
#include <ATen/ATen.h>

#include <memory>
#include <utility>
#include <vector>

#include "algorithms/comm.h"
#include "algorithms/select.h"
#include "backend/device_op.h"
#include "backend/scratch_pool.h"
#include "backend/reduce_scaling.h"

namespace smdccl {

// The group's compression: its 16-bit wire between nodes (F32: none), and
// whether it compresses inside nodes too.
struct WireChoice {
  Wire wire = Wire::F32;
  bool intra = false;
  bool int8 = false;  // block int8 between nodes (BackendConfig::int8)
};

class ReduceSemantics {
 public:
  // `tuning` and `scratch` are the group's, and outlive this.
  ReduceSemantics(WireChoice wire, const Tuning& tuning, ScratchPool& scratch)
      : wire_(wire), tuning_(tuning), scratch_(scratch) {}

  // Sets c's wire for a dt reduction with some compressed hop
  // (Comm::compressesSomeHop) and makes AVG pre-scale (16-bit range);
  // returns the wire (F32: no hop compressed, the op runs uncompressed).
  Wire useWire(Comm& c, DType dt, ReduceSpec& spec) const;
  // One allreduce of t in place (on the op's device, or the host):
  // pre-scale, reduce, post-divide, fp16 overflow check.
  void allreduceOne(Comm& c, at::Tensor& t, ReduceSpec spec, const std::shared_ptr<DeviceOp>& dev,
                    const Tuning& tuning) const;
  // One allreduce over `ts` packed flat (same dtype and op): on the host, or
  // on `dev`'s device for CUDA tensors.
  void allreduceFlat(Comm& c, std::vector<at::Tensor>& ts, std::vector<ReduceSpec>& specs,
                     const std::shared_ptr<DeviceOp>& dev) const;
  // A host reduce-scatter: `work` (laid out as blocks) holds every block
  // and is used up; block c.rank() reduced over the group lands in
  // `output`. With `input` (contiguous, laid out as blocks, left as it
  // was; a reduction with no pre-scale), every block is read there and
  // `work` is only scratch.
  struct HostReduceScatter {
    at::Tensor& work;
    const Blocks& blocks;
    at::Tensor& output;
    const at::Tensor* input = nullptr;
  };
  void reduceScatter(Comm& c, const HostReduceScatter& r, const ReduceSpec& spec) const;
  // A reduce-scatter on the op's device: `input` (c.size() blocks of
  // output's length) into `output`. `input` is left as it was unless it is
  // the op's own scratch (`inputIsScratch`: a pre-scale then works in place).
  struct DeviceReduceScatter {
    const at::Tensor& input;
    at::Tensor& output;
    bool inputIsScratch = false;
  };
  void reduceScatter(Comm& c, DeviceOp& dev, const DeviceReduceScatter& r, ReduceSpec spec,
                     const Tuning& tuning) const;
  // The list form on the op's device: `inputs` (one per rank, of the
  // blocks' lengths) padded into one device buffer, this rank's block into
  // `output`.
  struct DeviceListReduceScatter {
    const std::vector<at::Tensor>& inputs;
    const Blocks& blocks;
    at::Tensor& output;
  };
  void reduceScatter(Comm& c, DeviceOp& dev, const DeviceListReduceScatter& r,
                     const ReduceSpec& spec, const Tuning& tuning) const;
  // Whether the int8 wire runs on c (an int8 group over several nodes of
  // one size, the whole group): the rule TwoLevelInt8::canRun also keeps.
  bool int8Runs(const Comm& c) const;
  // Whether a reduction of dt crosses the int8 wire as float32 (a bf16 /
  // fp16 SUM on an int8 group spanning nodes): widened to a float32 copy,
  // reduced, rounded to dt once at the end.
  bool int8Widens(const Comm& c, DType dt, const ReduceSpec& spec) const;
  // Whether a float32 reduction over the whole of c would cross a 16-bit
  // hop (int8: whether its SUM allreduce would run the int8 wire).
  bool compressesSomeHop(Comm& c) const;

 private:
  // A float32 buffer of numel on like's device (int8Widens' copies).
  at::Tensor wideBuffer(int64_t numel, const at::Tensor& like) const;
  // A reduce-scatter's widened input (`in` copied) and room for its
  // output, in one such buffer.
  std::pair<at::Tensor, at::Tensor> widenedInOut(const at::Tensor& in, int64_t outNumel) const;

  WireChoice wire_;
  const Tuning& tuning_;
  ScratchPool& scratch_;
  // The widened copies' host memory: the group's scratch may hold the 16-bit work.
  mutable ScratchPool widened_;
};

}  // namespace smdccl
