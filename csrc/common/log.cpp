#include "common/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/env.h"

namespace smdccl {

namespace env {
SMDCCL_ENV_CHOICE(kDebug, "SMDCCL_DEBUG", "WARN", "WARN, INFO, DETAIL, TRACE",
                  "Log level: WARN, INFO, DETAIL (INFO plus a cross-rank check of every "
                  "collective's full signature, tensor shapes included) or TRACE (to stderr, "
                  "prefixed with the rank).");
}  // namespace env

static std::atomic<int> gRank{-1};

LogLevel logLevel() {
  static const LogLevel level = [] {
    const std::string s = envChoice(env::kDebug);
    if (s == "info") return LogLevel::Info;
    if (s == "detail") return LogLevel::Detail;
    if (s == "trace") return LogLevel::Trace;
    return LogLevel::Warn;
  }();
  return level;
}

bool logEnabled(LogLevel level) { return static_cast<int>(level) <= static_cast<int>(logLevel()); }

bool torchDebugDetail() {
  const char* s = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  if (!s) return false;
  std::string v(s);
  for (auto& ch : v) ch = static_cast<char>(toupper(ch));
  return v == "DETAIL";
}

void setLogRank(int globalRank) {
  int expected = -1;
  gRank.compare_exchange_strong(expected, globalRank);
}

void logMessage(LogLevel level, const std::string& msg) {
  static std::mutex mu;
  static const char* names[] = {"WARN", "INFO", "DETAIL", "TRACE"};
  std::lock_guard<std::mutex> lock(mu);
  std::fprintf(stderr, "[smdccl %s rank %d pid %d] %s\n", names[static_cast<int>(level)],
               gRank.load(), static_cast<int>(getpid()), msg.c_str());
}

}  // namespace smdccl
