#pragma once
// SMDCCL_TRACE=path: a Chrome-trace timeline (chrome://tracing, Perfetto) of
// every collective of this process: when it was queued, when it ran, and its
// phases (checks, the algorithm the cost model picked, copies). One JSON file
// per rank: "{rank}" in the path is replaced by the global rank, else
// ".rank<r>" goes before the extension. Written when a group is destroyed and
// at exit. Off (one branch per span) when the variable is unset.
#include <cstdint>
#include <string>

namespace smdccl::trace {

bool enabled();
int64_t nowUs();  // microseconds on the steady clock
// A finished span: `track` groups spans on one line (the group's name).
struct FinishedSpan {
  std::string name;
  const char* category = "";
  const std::string* track = nullptr;
  int64_t startUs = 0;
  int64_t durUs = 0;
  std::string argsJson;
};
void record(FinishedSpan span);
void setRank(int globalRank);
// Writes everything recorded so far (the whole file, each time).
void flush();

// Records [construction, destruction) as one span.
class Span {
 public:
  Span(std::string name, const char* category, const std::string& track, std::string args = "")
      : on_(enabled()) {
    if (!on_) return;
    name_ = std::move(name);
    category_ = category;
    track_ = &track;
    args_ = std::move(args);
    start_ = nowUs();
  }
  ~Span() {
    if (on_)
      record({.name = std::move(name_),
              .category = category_,
              .track = track_,
              .startUs = start_,
              .durUs = nowUs() - start_,
              .argsJson = std::move(args_)});
  }
  Span(const Span&) = delete;
  Span& operator=(const Span&) = delete;

 private:
  bool on_;
  std::string name_, args_;
  const char* category_ = "";
  const std::string* track_ = nullptr;
  int64_t start_ = 0;
};

}  // namespace smdccl::trace
