#include "algorithms/collectives.h"

#include <cmath>
#include <mutex>
#include <set>
#include <tuple>

#include "common/log.h"
#include "common/trace.h"

namespace smdccl {

namespace {

GroupShape shapeOf(const Comm& c) {
  GroupShape g;
  g.ranks = c.size();
  if (c.levels && c.members.empty()) {
    g.nodes = c.levels->numNodes();
    g.maxLocal = c.levels->maxLocal();
    g.uniform = c.levels->uniform();
  } else {
    g.maxLocal = g.ranks;
  }
  return g;
}

std::string sizeLabel(size_t bytes) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  size_t v = bytes;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return std::to_string(v) + " " + unit[u];
}

// SMDCCL_DEBUG=INFO: each (collective, group shape, power-of-two size range)
// -> algorithm decision is logged once per process, with the model's estimates.
void logDecision(Collective coll, size_t bytes, const GroupShape& g, Algo chosen,
                 const Tuning& t, const char* note) {
  if (!logEnabled(LogLevel::Info)) return;
  static std::mutex mu;
  static std::set<std::tuple<int, int, int, bool, int, std::string>> seen;
  int bucket = bytes ? static_cast<int>(std::log2(static_cast<double>(bytes))) : -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert({static_cast<int>(coll), g.ranks, g.nodes, g.uniform, bucket, note}).second) return;
  }
  size_t lo = bucket < 0 ? 0 : size_t{1} << bucket;
  std::string est;
  for (Algo a : candidates(coll, g))
    est += strCat(est.empty() ? "" : ", ", algoName(a), " ",
                  static_cast<int64_t>(estimateSeconds(coll, a, static_cast<double>(bytes), g,
                                                       t.model, t.pipelineChunkBytes) * 1e6),
                  " us");
  SMDCCL_INFO(collectiveName(coll), " [", sizeLabel(lo), ", ", sizeLabel(lo ? lo * 2 : 1), ") on ",
              g.ranks, " ranks / ", g.nodes, g.nodes == 1 ? " node" : " nodes", " -> ",
              algoName(chosen), note, t.forced ? " (forced by SMDCCL_ALGO)" : "", "; model: ", est);
}

const std::string& trackOf(const Comm& c) {
  static const std::string none = "-";
  return c.ctx.group ? *c.ctx.group : none;
}

// `halving`: a ring would run as recursive halving/doubling (prefersHalving).
Algo decide(Collective coll, size_t bytes, const Comm& c, const Tuning& t, bool halving = false) {
  GroupShape g = shapeOf(c);
  Algo a = choose(coll, bytes, g, t);
  const char* note = halving && a == Algo::Ring ? " as recursive halving (16-bit hops)" : "";
  logDecision(coll, bytes, g, a, t, note);
  SMDCCL_TRACE(c.ctx.describe(), ": ", collectiveName(coll), " of ", bytes, " B -> ", algoName(a),
               note);
  return a;
}

// The span that shows the chosen algorithm in SMDCCL_TRACE's timeline.
trace::Span algorithmSpan(const Comm& c, Algo a, size_t bytes, bool halving = false) {
  return trace::Span(trace::enabled() ? strCat(algoName(a), halving && a == Algo::Ring ? " (halving)" : "",
                                               ", ", bytes, " B")
                                      : std::string(),
                     "algorithm", trackOf(c));
}

// A flat ring over compressed hops runs as recursive halving, for accuracy
// (prefersHalving), unless SMDCCL_ALGO=ring asks for the ring itself.
bool flatHalving(const Comm& c, DType dt, const Tuning& t) {
  return prefersHalving(c, dt) && !(t.forced && *t.forced == Algo::Ring);
}

// With a 16-bit wire the compressed levels move half the bytes.
Tuning forWire(const Comm& c, DType dt, const Tuning& t) {
  Tuning w = t;
  if (!c.compressesSomeHop(dt)) return w;
  w.model.inter.gbps *= 2;
  if (c.wireIntra) w.model.intra.gbps *= 2;
  return w;
}

}  // namespace

void allreduce(Comm& c, char* buf, size_t count, DType dt, RedOp op, const Tuning& given) {
  if (c.size() == 1 || count == 0) return;
  Tuning t = forWire(c, dt, given);
  bool halving = flatHalving(c, dt, t);
  Algo a = decide(Collective::Allreduce, count * elementSize(dt), c, t, halving);
  trace::Span span = algorithmSpan(c, a, count * elementSize(dt), halving);
  switch (a) {
    case Algo::Ring:
      if (halving) halvingAllreduce(c, buf, count, dt, op, t.pipelineChunkBytes);
      else ringAllreduce(c, buf, count, dt, op);
      break;
    case Algo::TwoLevelRing: twoLevelAllreduce(c, buf, count, dt, op, t.pipelineChunkBytes); break;
    case Algo::TwoLevelRd: twoLevelRdAllreduce(c, buf, count, dt, op); break;
    default: recursiveDoublingAllreduce(c, buf, count, dt, op); break;
  }
}

void reduceScatter(Comm& c, char* buf, const Blocks& b, DType dt, RedOp op, const Tuning& given) {
  if (c.size() == 1) return;
  Tuning t = forWire(c, dt, given);
  size_t total = b.total();
  bool halving = flatHalving(c, dt, t);
  Algo a = decide(Collective::ReduceScatter, total, c, t, halving);
  trace::Span span = algorithmSpan(c, a, total, halving);
  switch (a) {
    case Algo::RecursiveDoubling:
      // Tiny: one latency-optimal allreduce of everything beats p-1 ring steps.
      // Blocks are consecutive here (the backend packs them).
      recursiveDoublingAllreduce(c, buf + b.offset[0], total / elementSize(dt), dt, op);
      break;
    case Algo::TwoLevelRing: twoLevelReduceScatter(c, buf, b, dt, op); break;
    default:
      if (halving) halvingReduceScatter(c, buf, b, dt, op);
      else ringReduceScatter(c, buf, b, dt, op);
      break;
  }
}

void allgather(Comm& c, char* buf, const Blocks& b, const Tuning& t) {
  if (c.size() == 1) return;
  Algo a = decide(Collective::Allgather, b.total(), c, t);
  trace::Span span = algorithmSpan(c, a, b.total());
  switch (a) {
    case Algo::Direct: directAllgather(c, buf, b); break;
    case Algo::TwoLevelRing: twoLevelAllgather(c, buf, b); break;
    default: ringAllgather(c, buf, b); break;
  }
}

void broadcast(Comm& c, char* buf, size_t bytes, int root, const Tuning& t) {
  if (c.size() == 1) return;
  Algo a = decide(Collective::Broadcast, bytes, c, t);
  trace::Span span = algorithmSpan(c, a, bytes);
  switch (a) {
    case Algo::Chain: chainBroadcast(c, buf, bytes, root); break;
    case Algo::TwoLevelTree: twoLevelBroadcast(c, buf, bytes, root); break;
    default: treeBroadcast(c, buf, bytes, root); break;
  }
}

void barrier(Comm& c) {
  char token = 0;
  recursiveDoublingAllreduce(c, &token, 1, DType::U8, RedOp::Max);
}

}  // namespace smdccl
