#include "algorithms/gated_lane.h"

#include <stdexcept>

#include "common/error.h"

namespace smdccl {

void GatedLane::queue(uint64_t number, const std::function<void()>& queueCopy) {
  const uint32_t ticket = gate_.hold(q_);
  // The gate counts its holds: they must be this lane's copy numbers.
  if (ticket != static_cast<uint32_t>(number))
    throw std::logic_error(
        strCat("GatedLane: copy ", number, " queued out of turn (gate ticket ", ticket, ")"));
  queueCopy();
  q_.write(progress_, ticket);
}

}  // namespace smdccl
