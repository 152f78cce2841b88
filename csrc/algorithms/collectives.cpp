#include "algorithms/collectives.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "common/log.h"
#include "common/trace.h"

namespace smdccl {

std::vector<std::pair<const Algorithm*, double>> estimates(Collective coll, double bytes,
                                                           const Situation& s, const CostModel& m) {
  std::vector<std::pair<const Algorithm*, double>> out;
  for (const Algorithm* a : registeredAlgorithms())
    if (a->serves(coll) && a->canRun(coll, s) && a->autoCandidate(coll, s)) {
      double sec = s.g.ranks <= 1 ? 0.0 : a->estimate(coll, bytes, s, m);
      // The copy of the input into the working buffer (a memory copy costs
      // about what a shared-memory transfer of the bytes does).
      if (s.outOfPlace && !a->outOfPlace(coll)) sec += m.intra.bytesSeconds(bytes);
      out.emplace_back(a, sec);
    }
  return out;
}

Choice choose(Collective coll, size_t bytes, const Situation& s, const Tuning& t) {
  for (const Algorithm* a = t.forcedFor(coll); a;
       a = a->fallback() ? findAlgorithm(a->fallback()) : nullptr)
    if (a->serves(coll) && a->canRun(coll, s)) return {a, true};
  if (s.int8) {  // the cheapest int8 algorithm that runs (ties: the first registered)
    Choice int8;
    double cheapest = std::numeric_limits<double>::infinity();
    for (const Algorithm* a : registeredAlgorithms())
      if (a->int8Wire() && a->serves(coll) && a->canRun(coll, s)) {
        const double sec = a->estimate(coll, static_cast<double>(bytes), s, t.model);
        if (!int8.algo || sec < cheapest) {
          int8.algo = a;
          cheapest = sec;
        }
      }
    if (int8.algo) return int8;
  }
  Choice best;
  double bestT = std::numeric_limits<double>::infinity();
  for (const auto& [a, sec] : estimates(coll, static_cast<double>(bytes), s, t.model))
    if (!best.algo || sec < bestT) {
      best.algo = a;
      bestT = sec;
    }
  if (!best.algo) throw std::logic_error(strCat("no algorithm can run ", collectiveName(coll)));
  return best;
}

Situation situationFor(const GroupShape& g, const WireHops& w, const Tuning& t) {
  Situation s;
  s.g = g;
  s.someHop16 = w.some;
  s.everyHop16 = w.every;
  s.pipelineChunkBytes = t.pipelineChunkBytes;
  return s;
}

Tuning forWire(const WireHops& w, const Tuning& t) {
  Tuning wired = t;
  if (!w.some) return wired;
  wired.model.inter.gbps *= 2;
  if (w.intra) wired.model.intra.gbps *= 2;
  return wired;
}

WireHops wireHopsOf(const Comm& c, DType dt) {
  return {.some = c.compressesSomeHop(dt), .every = c.compressesEveryHop(dt), .intra = c.wireIntra};
}

namespace {

// The nodes a sub-communicator's ranks are on (its indices, by node): the
// step across nodes of the CUDA paths (a rank per node) is costed on the
// network it crosses.
Hierarchy nodesOfMembers(const Comm& c) {
  std::map<int, std::vector<int>> byNode;
  for (int i = 0; i < c.size(); ++i)
    byNode[c.mesh.topology().nodeOf[c.members[static_cast<size_t>(i)]]].push_back(i);
  Hierarchy h;
  for (auto& [node, ranks] : byNode) h.nodes.push_back(std::move(ranks));
  return h;
}

GroupShape shapeOf(const Hierarchy& h, int ranks) {
  return {.ranks = ranks, .nodes = h.numNodes(), .maxLocal = h.maxLocal(), .uniform = h.uniform()};
}

Situation situationOf(const Comm& c, DType dt, const WireHops& hops, const Tuning& t) {
  GroupShape g{.ranks = c.size(), .maxLocal = c.size()};  // no levels: one node
  if (!c.members.empty()) g = shapeOf(nodesOfMembers(c), c.size());
  else if (c.levels) g = shapeOf(*c.levels, c.size());
  Situation s = situationFor(g, hops, t);
  s.int8 = c.int8 && dt == DType::F32 && c.size() > 1;
  s.int8Feedback = s.int8 && static_cast<bool>(c.int8Feedback);
  s.subgroup = !c.members.empty();
  return s;
}

// What a choice on c for dt reads: the model as c's wire changes it, and
// the situation; c's hops are asked once for both.
struct Setting {
  Tuning t;
  Situation s;
};
Setting settingOf(const Comm& c, DType dt, const Tuning& given) {
  const WireHops hops = wireHopsOf(c, dt);
  Setting out{forWire(hops, given), {}};
  out.s = situationOf(c, dt, hops, out.t);
  return out;
}

}  // namespace

Situation situationOf(const Comm& c, DType dt, const Tuning& t) {
  return situationOf(c, dt, wireHopsOf(c, dt), t);
}

namespace {

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

// SMDCCL_DEBUG=INFO: each (collective, group shape, wire, power-of-two size
// range) -> algorithm decision is logged once per process, with every
// candidate's estimate.
void logDecision(Collective coll, size_t bytes, const Situation& s, const Choice& chosen,
                 const Tuning& t) {
  if (!logEnabled(LogLevel::Info)) return;
  static std::mutex mu;
  static std::set<std::tuple<int, int, int, bool, bool, int>> seen;
  const GroupShape& g = s.g;
  int bucket = bytes ? static_cast<int>(std::log2(static_cast<double>(bytes))) : -1;
  {
    std::lock_guard<std::mutex> lock(mu);
    if (!seen.insert({static_cast<int>(coll), g.ranks, g.nodes, g.uniform, s.someHop16, bucket})
             .second)
      return;
  }
  size_t lo = bucket < 0 ? 0 : size_t{1} << bucket;
  std::string est;
  for (const auto& [a, sec] : estimates(coll, static_cast<double>(bytes), s, t.model))
    est += strCat(est.empty() ? "" : ", ", a->name(), " ", static_cast<int64_t>(sec * 1e6), " us");
  SMDCCL_INFO(collectiveName(coll), " [", sizeLabel(lo), ", ", sizeLabel(lo ? lo * 2 : 1), ") on ",
              g.ranks, " ranks / ", g.nodes, g.nodes == 1 ? " node" : " nodes",
              s.someHop16 ? " (16-bit wire)" : "", " -> ", chosen.algo->name(),
              chosen.forced ? " (forced by SMDCCL_ALGO)" : "", "; model: ", est);
}

const std::string& trackOf(const Comm& c) {
  static const std::string none = "-";
  return c.ctx.group ? *c.ctx.group : none;
}

// The message's bytes as the model counts them (Algorithm::estimate).
size_t messageBytes(Collective coll, const CollectiveArgs& a) {
  switch (coll) {
    case Collective::ReduceScatter:
    case Collective::Allgather: return a.blocks->total();
    case Collective::Broadcast: return a.bytes;
    default: return a.count * elementSize(a.dt);
  }
}

// An out-of-place reduce-scatter on an algorithm that reduces in place:
// the input copied into buf (unless it is buf), the result copied out.
void runInPlace(const Algorithm& algo, Comm& c, const CollectiveArgs& a, const Tuning& t) {
  const Blocks& b = *a.blocks;
  if (a.in != a.buf && b.total()) std::memcpy(a.buf, a.in, b.total());
  CollectiveArgs inPlace = a;
  inPlace.in = nullptr;
  inPlace.out = nullptr;
  algo.run(Collective::ReduceScatter, c, inPlace, t);
  if (b.length[c.rank()]) std::memmove(a.out, a.buf + b.offset[c.rank()], b.length[c.rank()]);
}

void dispatch(Collective coll, Comm& c, const CollectiveArgs& a, const Tuning& given) {
  const size_t bytes = messageBytes(coll, a);
  auto [t, s] = settingOf(c, a.dt, given);
  s.outOfPlace = coll == Collective::ReduceScatter && a.in && a.in != a.buf;
  Choice choice = choose(coll, bytes, s, t);
  logDecision(coll, bytes, s, choice, t);
  SMDCCL_TRACE(c.ctx.describe(), ": ", collectiveName(coll), " of ", bytes, " B -> ",
               choice.algo->name());
  trace::Span span(
      trace::enabled() ? strCat(choice.algo->name(), ", ", bytes, " B") : std::string(),
      "algorithm", trackOf(c));
  if (coll == Collective::ReduceScatter && a.out && !choice.algo->outOfPlace(coll))
    return runInPlace(*choice.algo, c, a, t);
  choice.algo->run(coll, c, a, t);
}

}  // namespace

void allreduce(Comm& c, const CollectiveArgs& a, const Tuning& t) {
  if (c.size() == 1 || a.count == 0) return;
  dispatch(Collective::Allreduce, c, a, t);
}

const Algorithm* allreduceAlgorithm(const Comm& c, size_t count, DType dt, const Tuning& given) {
  const auto [t, s] = settingOf(c, dt, given);
  return choose(Collective::Allreduce, count * elementSize(dt), s, t).algo;
}

const Algorithm* reduceScatterAlgorithm(const Comm& c, size_t bytes, DType dt,
                                        const Tuning& given) {
  const auto [t, s] = settingOf(c, dt, given);
  return choose(Collective::ReduceScatter, bytes, s, t).algo;
}

void reduceScatter(Comm& c, const CollectiveArgs& a, const Tuning& t) {
  if (c.size() == 1) {
    if (a.in && a.out != a.in && a.blocks->length[0]) std::memmove(a.out, a.in, a.blocks->length[0]);
    return;
  }
  dispatch(Collective::ReduceScatter, c, a, t);
}

void allgather(Comm& c, char* buf, const Blocks& b, const Tuning& t) {
  if (c.size() == 1) return;
  CollectiveArgs a;
  a.buf = buf;
  a.blocks = &b;
  dispatch(Collective::Allgather, c, a, t);
}

void broadcast(Comm& c, char* buf, size_t bytes, int root, const Tuning& t) {
  if (c.size() == 1) return;
  CollectiveArgs a;
  a.buf = buf;
  a.bytes = bytes;
  a.root = root;
  dispatch(Collective::Broadcast, c, a, t);
}

void reduce(Comm& c, const CollectiveArgs& a, const Tuning& t) {
  if (c.size() == 1 || a.count == 0) return;
  dispatch(Collective::Reduce, c, a, t);
}

void barrier(Comm& c) {
  char token = 0;
  recursiveDoublingAllreduce(c, &token, 1, DType::U8, RedOp::Max);
}

}  // namespace smdccl
