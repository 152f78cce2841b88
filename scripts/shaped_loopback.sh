#!/usr/bin/env bash
# Runs a command with the loopback interface shaped by a tbf qdisc, as
# `tc qdisc add dev lo root tbf rate <R>gbit burst 4mb latency 50ms`: ranks
# of one machine that talk over 127.0.0.1 (NCCL's socket transport under
# --nccl-ranks-as-hosts, smdccl's TCP links between nodes) then meet a slow
# link's limit instead of the host's copy speed. tbf on lo puts every
# loopback packet through one queue: both directions together share R.
# Where it may (unshare -n), it shapes the lo of a network namespace of its
# own: nothing else on the machine is slowed, and nothing stays shaped if
# it is killed. Else it shapes the machine's lo and removes the qdisc on
# exit (gpu_check.sh removes it again after the step, in case of a kill).
# Before the command, scripts/loopback_rate.py checks that the shaping holds
# (one TCP stream within 0.7-1.1x of R).
# Usage: scripts/shaped_loopback.sh GBIT -- CMD...   (PY=... the interpreter)
# Exit: 3 when lo cannot be shaped here (no tc, no tbf, lo not up), 4 when
# the shaping does not hold, else CMD's.
set -uo pipefail
cd "$(dirname "$0")/.."
gbit=$1
shift
[[ "${1:-}" == "--" ]] && shift
PY=${PY:-python3}
if [[ -z "${SMDCCL_SHAPED_NETNS:-}" ]] && command -v ip > /dev/null && unshare -n true 2> /dev/null; then
  exec unshare -n env SMDCCL_SHAPED_NETNS=1 bash -c \
    'ip link set lo up || { echo "shaped_loopback: cannot bring lo up in a new namespace" >&2; exit 3; }
     exec bash "$0" "$@"' "$0" "$gbit" -- "$@"
fi
if ! tc qdisc replace dev lo root tbf rate "${gbit}gbit" burst 4mb latency 50ms; then
  echo "shaped_loopback: tc cannot put a tbf qdisc on lo here" >&2
  exit 3
fi
if [[ -z "${SMDCCL_SHAPED_NETNS:-}" ]]; then
  # bash runs an EXIT trap on a signal only where a trap for it exits
  trap 'tc qdisc del dev lo root 2> /dev/null' EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
fi
echo "shaped_loopback: lo shaped to ${gbit} Gbit/s (tbf burst 4mb latency 50ms)" \
  "${SMDCCL_SHAPED_NETNS:+in a network namespace of its own}"
"$PY" scripts/loopback_rate.py --expect-mbps "$(( gbit * 125 ))" || exit 4
"$@"
