#pragma once
// Levelled logging to stderr, controlled by SMDCCL_DEBUG.
#include <string>

#include "common/error.h"

namespace smdccl {

// Detail: Info plus the full cross-rank fingerprint of every collective.
enum class LogLevel { Warn = 0, Info = 1, Detail = 2, Trace = 3 };

LogLevel logLevel();
bool logEnabled(LogLevel level);
void logMessage(LogLevel level, const std::string& msg);
// Ranks prefix every line; set once per process by the first backend.
void setLogRank(int globalRank);
// TORCH_DISTRIBUTED_DEBUG=DETAIL asks for the same cross-rank checks.
bool torchDebugDetail();

}  // namespace smdccl

#define SMDCCL_LOG(level, ...)                                                                   \
  do {                                                                                           \
    if (::smdccl::logEnabled(level)) ::smdccl::logMessage(level, ::smdccl::strCat(__VA_ARGS__)); \
  } while (0)
#define SMDCCL_WARN(...) SMDCCL_LOG(::smdccl::LogLevel::Warn, __VA_ARGS__)
#define SMDCCL_INFO(...) SMDCCL_LOG(::smdccl::LogLevel::Info, __VA_ARGS__)
#define SMDCCL_TRACE(...) SMDCCL_LOG(::smdccl::LogLevel::Trace, __VA_ARGS__)
