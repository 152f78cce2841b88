#include "algorithms/plan.h"

#include "common/error.h"

namespace smdccl {

Plan planFor(const PlanQuery& q, const Tuning& given) {
  const GroupShape& g = q.shape;
  SMDCCL_CHECK_ARG(g.ranks >= 1 && g.nodes >= 1 && g.maxLocal >= 1 && g.nodes <= g.ranks &&
                       g.maxLocal <= g.ranks,
                   "plan: inconsistent group shape");
  SMDCCL_CHECK_ARG(q.bytes >= 0 && q.bytes < 4.6e18, "plan: bytes must be in [0, 2^62), got ",
                   q.bytes);
  // Reductions cross nodes compressed, as a group with compression does.
  const bool reduction = q.coll != Collective::Allgather && q.coll != Collective::Broadcast;
  WireHops w;
  w.some = q.compression.wire != Wire::F32 && reduction && g.nodes > 1;
  w.every = w.some && g.maxLocal == 1;
  const Tuning t = forWire(w, given);
  Situation s = situationFor(g, w, t);
  s.int8 = q.compression.int8 && reduction && g.ranks > 1;  // float32 SUM
  Plan p;
  for (const Algorithm* a : registeredAlgorithms())
    if (a->serves(q.coll) && a->canRun(q.coll, s))
      p.estimates[a->name()] = g.ranks <= 1 ? 0.0 : a->estimate(q.coll, q.bytes, s, t.model);
  p.chosen = choose(q.coll, static_cast<size_t>(q.bytes), s, t).algo->name();
  p.model = t.model.describe();
  return p;
}

}  // namespace smdccl
