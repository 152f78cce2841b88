#include "common/trace.h"

#include <cstdint>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "common/env.h"
#include "common/log.h"

namespace smdccl {
namespace env {
SMDCCL_ENV_TEXT(kTrace, "SMDCCL_TRACE", "",
                "Chrome-trace timeline (chrome://tracing, Perfetto) of every collective: queued, "
                "run, its checks and the algorithm picked, one JSON file per rank ('{rank}' in "
                "the path is replaced by the global rank, else '.rank<r>' goes before the "
                "extension); written when a group is destroyed and at exit.");
}  // namespace env
}  // namespace smdccl

namespace smdccl::trace {

namespace {

constexpr size_t kMaxEvents =
    1 << 20;  // ~100 MB of JSON at most; later spans are counted, not kept

struct Event {
  std::string name;
  const char* category;
  int track;
  int64_t start, dur;
  std::string args;
};

struct Recorder {
  std::mutex mu;
  std::vector<Event> events;
  std::map<std::string, int> tracks;  // track name -> tid
  uint64_t dropped = 0;
  std::atomic<int> rank{-1};
  bool atExitRegistered = false;
};

Recorder& rec() {
  static Recorder* r = new Recorder;  // never destroyed: flushed at exit, used until then
  return *r;
}

std::string jsonEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) continue;
    out += c;
  }
  return out;
}

std::string pathFor(int rank) {
  std::string path = envString(env::kTrace);
  std::string r = std::to_string(rank < 0 ? 0 : rank);
  auto at = path.find("{rank}");
  if (at != std::string::npos) return path.replace(at, 6, r);
  auto slash = path.find_last_of('/');
  auto dot = path.find_last_of('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash))
    return path + ".rank" + r;
  return path.substr(0, dot) + ".rank" + r + path.substr(dot);
}

}  // namespace

bool enabled() {
  static const bool on = !envString(env::kTrace).empty();
  return on;
}

int64_t nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void setRank(int globalRank) {
  int expected = -1;
  rec().rank.compare_exchange_strong(expected, globalRank);
}

void record(FinishedSpan span) {
  if (!enabled()) return;
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  if (!r.atExitRegistered) {
    r.atExitRegistered = true;
    std::atexit([] { flush(); });
  }
  if (r.events.size() >= kMaxEvents) {
    ++r.dropped;
    return;
  }
  auto it = r.tracks.emplace(*span.track, static_cast<int>(r.tracks.size())).first;
  r.events.push_back({std::move(span.name), span.category, it->second, span.startUs, span.durUs,
                      std::move(span.argsJson)});
}

void flush() {
  if (!enabled()) return;
  Recorder& r = rec();
  std::lock_guard<std::mutex> lock(r.mu);
  int rank = r.rank.load();
  std::string path = pathFor(rank);
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (!f) {
    SMDCCL_WARN("SMDCCL_TRACE: cannot write ", tmp);
    return;
  }
  std::fprintf(f,
               "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,\"dropped_spans\":%llu},"
               "\"traceEvents\":[\n",
               rank, static_cast<unsigned long long>(r.dropped));
  std::fprintf(
      f, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}}",
      rank, rank);
  for (const auto& [name, tid] : r.tracks)
    std::fprintf(f,
                 ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":%d,\"tid\":%d,"
                 "\"args\":{\"name\":\"group %s\"}}",
                 rank, tid, jsonEscape(name).c_str());
  for (const auto& e : r.events)
    std::fprintf(f,
                 ",\n{\"ph\":\"X\",\"name\":\"%s\",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,"
                 "\"ts\":%lld,\"dur\":%lld,\"args\":{%s}}",
                 jsonEscape(e.name).c_str(), e.category, rank, e.track,
                 static_cast<long long>(e.start), static_cast<long long>(e.dur), e.args.c_str());
  std::fprintf(f, "\n]}\n");
  bool ok = std::fclose(f) == 0;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    SMDCCL_WARN("SMDCCL_TRACE: cannot write ", path);
}

}  // namespace smdccl::trace
