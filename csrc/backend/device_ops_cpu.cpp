// The CPU build's DeviceOps: no tensor may be on a GPU.
#ifndef SMDCCL_WITH_CUDA
#include "backend/device_op.h"

namespace smdccl {

namespace {
class CpuOnlyDeviceOps : public DeviceOps {
 public:
  std::shared_ptr<DeviceOp> begin(const std::vector<at::Tensor>& tensors,
                                  const char* opName) override {
    deviceOf(tensors, opName);
    return nullptr;
  }
  int deviceOf(const std::vector<at::Tensor>& tensors, const char* opName) override {
    for (const auto& t : tensors)
      TORCH_CHECK_VALUE(!t.defined() || t.device().is_cpu(), "smdccl: ", opName,
                        ": a tensor is on ", t.device(),
                        "; this build of smdccl has no CUDA support (it was built without "
                        "nvcc or against a CPU build of torch): move it with .cpu(), or "
                        "rebuild smdccl where nvcc and a CUDA torch are found");
    return -1;
  }
  HostCopy hostCopyForSend(const at::Tensor& t) override { return {t, nullptr}; }
  HostLanding hostForRecv(const at::Tensor& t) override { return {t, nullptr, nullptr}; }
};
}  // namespace

std::unique_ptr<DeviceOps> makeDeviceOps(KVStore&, std::function<std::chrono::milliseconds()>) {
  return std::make_unique<CpuOnlyDeviceOps>();
}

}  // namespace smdccl
#endif
