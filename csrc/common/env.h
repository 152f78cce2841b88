#pragma once
// Every SMDCCL_* environment variable is declared here, once, with its
// default and meaning (printed by `python -m smdccl.info`, listed in README).
#include <cstdint>
#include <string>
#include <vector>

namespace smdccl {

struct EnvVar {
  enum class Kind { Text, Int, Number };
  const char* name;
  const char* defaultValue;
  const char* help;
  // Numbers: what they must be, and the range they must lie in (checked
  // when a group is created, so a bad value fails there and says the range).
  Kind kind = Kind::Text;
  double min = 0;
  double max = 0;
  // Text with a fixed set of values: them, separated by ", " ("" = any).
  const char* choices = "";
};

// The declared variables, in a stable order.
const std::vector<EnvVar>& envVars();

// Reads a declared variable (throws std::logic_error for an undeclared one,
// so a typo in our code cannot silently read nothing). envInt / envDouble
// throw InvalidArgument, naming the variable and its range, for a value
// that is not a number of the right kind or lies outside the range.
std::string envString(const char* name);
int64_t envInt(const char* name);
double envDouble(const char* name);

// Reads every declared variable that is set, so that a bad value fails at
// group creation (naming it) instead of at the first collective that reads it.
void checkEnvironment();

namespace env {
constexpr const char* kDebug = "SMDCCL_DEBUG";
constexpr const char* kAlgo = "SMDCCL_ALGO";
constexpr const char* kTopology = "SMDCCL_TOPOLOGY";
constexpr const char* kSocketIfname = "SMDCCL_SOCKET_IFNAME";
constexpr const char* kShmRingKB = "SMDCCL_SHM_RING_KB";
constexpr const char* kTuneFile = "SMDCCL_TUNE_FILE";
constexpr const char* kPipelineChunkKB = "SMDCCL_PIPELINE_CHUNK_KB";
constexpr const char* kTcpBufferKB = "SMDCCL_TCP_BUFFER_KB";
constexpr const char* kSpinUs = "SMDCCL_SPIN_US";
constexpr const char* kIdleSpinUs = "SMDCCL_IDLE_SPIN_US";
constexpr const char* kAutoload = "SMDCCL_AUTOLOAD";
constexpr const char* kCompression = "SMDCCL_COMPRESSION";
constexpr const char* kCompressionIntra = "SMDCCL_COMPRESSION_INTRA";
constexpr const char* kFusionMB = "SMDCCL_FUSION_MB";
constexpr const char* kNanCheck = "SMDCCL_NAN_CHECK";
constexpr const char* kWarnAfter = "SMDCCL_WARN_AFTER";
constexpr const char* kTrace = "SMDCCL_TRACE";
constexpr const char* kCudaIpc = "SMDCCL_CUDA_IPC";
constexpr const char* kCudaIpcMB = "SMDCCL_CUDA_IPC_MB";
constexpr const char* kCudaOneShotKB = "SMDCCL_CUDA_ONESHOT_KB";
constexpr const char* kCudaStageChunkKB = "SMDCCL_CUDA_STAGE_CHUNK_KB";
constexpr const char* kCudaStagedRing = "SMDCCL_CUDA_STAGED_RING";
constexpr const char* kCudaMaxSms = "SMDCCL_CUDA_MAX_SMS";
}  // namespace env

}  // namespace smdccl
