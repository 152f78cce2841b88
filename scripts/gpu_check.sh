#!/usr/bin/env bash
# GPU verification of smdccl's CUDA paths, on a machine with a GPU:
#   1. builds the extension, the kernel tests and the kernel benchmark against
#      the torch found here (architecture: this GPU's);
#   2. runs, most telling first, each step under its own time limit:
#      what the machine allows (NCCL version, network namespaces); kernel unit
#      tests; stream semantics; the IPC out-of-memory test (alone); then side
#      by side: DDP vs gloo, FSDP2 on CUDA, every collective at 2 and 4 ranks
#      sharing the GPU, two-level / staged / fp16 wire, the packed staged path
#      against CPU tensors' bits, the int8 wire and its error feedback across
#      nodes; allreduce beside NCCL on this one GPU (every rank a host to
#      NCCL, --nccl-ranks-as-hosts) at 2 ranks on loopback shaped to 10 Gbit/s
#      (scripts/shaped_loopback.sh) and unshaped; NCCL as the engine inside
#      the node (forced, each rank its own NCCL_HOSTID, alone); the NCCL
#      comparison at 4 ranks and in smdccl's 2x2 layout; the packed staged
#      path against float32 staging and gloo (scripts/cuda_staged_bench.py);
#      NCCL and smdccl between emulated nodes on a shaped 10 Gbit/s link (where
#      namespaces work); the kernel benchmark; every collective vs gloo;
#   3. writes bench/results/<gpu>-<date>.{json,md} (scripts/gpu_report.py).
# A lent GPU machine gives one 10-minute command at a time, so the whole check
# runs under one budget (SMDCCL_GPU_CHECK_BUDGET seconds, default 570): a step
# gets the smaller of its own limit and what is left, a step with under 20 s
# left is recorded as not run, and the report is always written. Each test
# step is its own pytest run with its own JUnit file, so a step stopped by its
# limit loses only its own verdict.
# Usage: bash scripts/gpu_check.sh [--quick]   (PYTHON=... to pick the interpreter;
#        SMDCCL_GPU_CHECK_OUT=dir for the results; logs go there too;
#        SMDCCL_GPU_CHECK_TESTS=<pytest -k expression> narrows every test step;
#        SMDCCL_GPU_CHECK_SKIP="step ..." leaves steps out, names as in steps.txt;
#        SMDCCL_GPU_CHECK_GROUP_RESERVE=s kept from the parallel test steps for
#        the steps after them, default 100;
#        SMDCCL_GPU_CHECK_RESUME=1 goes on with an earlier command's check in the
#        same results folder: steps with a result and the build are not redone)
set -uo pipefail
cd "$(dirname "$0")/.."
START=$SECONDS
BUDGET=${SMDCCL_GPU_CHECK_BUDGET:-570}
REPORT_RESERVE=15  # seconds kept for the report
PY=${PYTHON:-python3}
QUICK=0
[[ "${1:-}" == "--quick" ]] && QUICK=1
OUT=${SMDCCL_GPU_CHECK_OUT:-bench/results}
mkdir -p "$OUT"
# One interpreter start (torch's import takes seconds of the budget): the
# GPU's name, count and architecture, and torch's version.
read -r GPU NGPU ARCH TORCH_VERSION < <("$PY" -c "
import torch
if torch.cuda.is_available():
    a, b = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0).replace('NVIDIA ', '').replace(' ', '-')
    print(name, torch.cuda.device_count(), f'{a}{b}', torch.__version__)")
[[ -n "${ARCH:-}" ]] || { echo "gpu_check: torch sees no CUDA device here" >&2; exit 2; }
DATE=$(date -u +%F)
STEM="$OUT/${GPU}-${DATE}"
LOGS="$OUT/gpu-check-logs"
mkdir -p "$LOGS"
[[ "${SMDCCL_GPU_CHECK_RESUME:-0}" == 1 ]] || : > "$LOGS/steps.txt"  # one line per step: name, rc (124: stopped by its limit; skipped), seconds
echo "gpu_check: $GPU x$NGPU (sm_$ARCH), torch $TORCH_VERSION, results $STEM.{json,md}, budget ${BUDGET} s"

MIN_STEP=20  # a step with less time than this left is not started
exec 3>&1  # the console, for step summaries while a step's output goes to its log
status=0
source scripts/gpu_steps.sh  # run_step, pytest_step

# 1. build: one CMake tree for the module, the kernel tests and the benchmark.
# The module must use the libstdc++ that Python loads: the system compiler,
# not another GCC first on PATH (one GPU image has /opt/gcc, whose build put
# its own libstdc++ into the module and crashed it).
# SMDCCL_CXX=... picks another (an image may export CXX=/opt/gcc/bin/g++).
if [[ -n "${SMDCCL_CXX:-}" ]]; then export CXX=$SMDCCL_CXX
elif [[ -x /usr/bin/g++ ]]; then export CXX=/usr/bin/g++; fi
export CUDAHOSTCXX=${CXX:-}
BUILD=build/gpu-check
build() {
  rm -rf "$BUILD"  # a cached configure would keep an earlier compiler
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSMDCCL_CUDA_ARCHS="$ARCH" \
    -DCMAKE_PREFIX_PATH="$("$PY" -c 'import torch;print(torch.utils.cmake_prefix_path)')" \
    -DPython3_EXECUTABLE="$(command -v "$PY")" -DSMDCCL_PYTHON_OUT_DIR="$PWD/python/smdccl" &&
  cmake --build "$BUILD" --target smdccl_C smdccl_cuda_tests smdccl_cuda_kernel_bench -j "$(nproc)"
}
export -f build; export BUILD ARCH PY
run_step build 400 bash -c build > "$LOGS/build.log" 2>&1 ||
  { tail -40 "$LOGS/build.log"; echo "gpu_check: build failed"; exit 1; }
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import smdccl._C as C; b=C.build_info(); assert b['cuda'], b; print('built:', b)" || exit 1

# 2. tests and benchmarks, most telling first.
# What this machine allows, for the steps below and the report.
probe() {
  "$PY" -c "import torch; print('nccl', '.'.join(map(str, torch.cuda.nccl.version())))"
  if ip netns add smdccl-probe 2>/dev/null; then ip netns del smdccl-probe; echo "netns yes"
  else echo "netns no"; fi
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
}
export -f probe
run_step probe 30 bash -c probe > "$LOGS/probe.txt" 2>&1
cat "$LOGS/probe.txt"

run_step kernel-tests 90 "$BUILD/smdccl_cuda_tests" > "$LOGS/kernel-tests.txt" 2>&1 ||
  grep -m20 FAIL "$LOGS/kernel-tests.txt"
tail -1 "$LOGS/kernel-tests.txt"

pytest_step stream 260 "stream_semantics or behind_queued_work or never_arrives" tests/test_cuda.py
# A failed stream-semantics test is re-run once with CUDA's lazy module
# loading off: a stream that waits on work not yet queued can deadlock
# against a lazy load (which synchronizes the context), so the two outcomes
# side by side tell that apart from an ordering bug (diagnosis only: the
# check has failed either way).
# The same for the blocking-call tests (2026-11-27: the gated staged copies,
# since removed with every other stream wait on host memory, hung).
mapfile -t EAGER_IDS < <(sed -n 's/^FAILED \(tests\/test_cuda.py::test_cuda_\(stream_semantics\|blocking_call_behind_queued_work\)[^ ]*\).*/\1/p' \
  "$LOGS/test_cuda-stream.txt" 2>/dev/null)
if (( ${#EAGER_IDS[@]} )); then
  CUDA_MODULE_LOADING=EAGER PYTHONUNBUFFERED=1 run_step stream-eager 100 "$PY" -m pytest -q -rs \
    "${EAGER_IDS[@]}" > "$LOGS/test_cuda_stream_eager.txt" 2>&1
  echo "failed stream tests again with CUDA_MODULE_LOADING=EAGER: $(tail -1 "$LOGS/test_cuda_stream_eager.txt")"
fi

# Alone: it takes every byte of the GPU's memory.
pytest_step out-of-memory 60 "out_of_memory" tests/test_cuda.py

# Correctness on CUDA tensors, the test steps side by side (16 cores; each
# its own process groups on the shared GPU): DDP vs gloo, FSDP2, every
# collective at 2 and 4 ranks, two-level / staged / fp16 wire, the packed
# staged path against CPU tensors' bits, the int8 wire and its error feedback.
# A step that hangs leaves GROUP_RESERVE seconds for the steps after it.
GROUP_RESERVE=${SMDCCL_GPU_CHECK_GROUP_RESERVE:-100}
STEP_RESERVE=$GROUP_RESERVE pytest_step ddp 140 ddp_matches_gloo tests/test_cuda.py &
STEP_RESERVE=$GROUP_RESERVE pytest_step fsdp2 140 "" tests/test_fsdp.py::test_fsdp2_cuda_matches_single_process &
STEP_RESERVE=$GROUP_RESERVE pytest_step matrix 200 \
  "one_node or settings_must_agree or code_compiled or fusion or pinned_staging" tests/test_cuda.py &
# (Each test in one step only: those forcing NCCL, under nccl-intra below;
# the node-mate and blocking-call ones under stream.)
STEP_RESERVE=$GROUP_RESERVE pytest_step two-level 400 "two_level and not nccl" tests/test_cuda.py &
STEP_RESERVE=$GROUP_RESERVE pytest_step packed 240 \
  "(packed_staged_path or int8_wire_across or int8_error_feedback) and not nccl" tests/test_cuda.py &
wait

# NCCL as the engine inside the node (forced, each rank its own NCCL_HOSTID),
# alone: NCCL's kernels spin for their whole time slice on a shared GPU and
# would slow every step beside them.
pytest_step nccl-intra 300 "nccl and not never_arrives and not behind_queued_work" tests/test_cuda.py

# smdccl beside NCCL on this one GPU: every rank a host of its own to NCCL
# (--nccl-ranks-as-hosts: its socket transport over loopback, as between
# nodes), smdccl with every rank its own node, then smdccl's two-level layout
# (2x2) beside NCCL's 4 hosts. Alone on the machine: these are timings, run
# after the correctness steps, which a short run must not miss.
NCCL_SIZES=${SMDCCL_GPU_CHECK_NCCL_SIZES:-4K,64K,1M,16M,64M,256M}
# nccl_bench NAME RANKS BACKENDS CAP [PREFIX...]: PREFIX (VAR=VALUE words, then
# a wrapper command) goes before the benchmark's command; NCCL_BENCH_SIZES
# overrides NCCL_SIZES.
nccl_bench() {
  local name=$1 n=$2 backends=$3 cap=$4; shift 4
  run_step "$name" "$cap" env "$@" "$PY" -m torch.distributed.run --nproc-per-node "$n" -m smdccl.bench \
    --device cuda --nccl-ranks-as-hosts --backends "$backends" --collectives allreduce \
    --sizes "${NCCL_BENCH_SIZES:-$NCCL_SIZES}" --target-time 0.2 --json "$LOGS/$name.json" --no-progress \
    > "$LOGS/$name.txt" 2>&1 || tail -20 "$LOGS/$name.txt"
  sed -n '/^shaped_loopback\|^loopback_rate/p; /^# allreduce/,/^# avg/p' "$LOGS/$name.txt"
}
# Link-bound: loopback shaped to 10 Gbit/s (both directions share it), 2 ranks
# as hosts, with every wire. Exit 3 (recorded n/a): tc cannot shape lo on
# this machine. NCCL on lo whatever the image exports (its namespace may
# have nothing else). The qdisc is taken off the machine's lo again in
# case the step was killed before its own trap ran.
STEP_NA=3 NCCL_BENCH_SIZES=4K,1M,64M nccl_bench nccl-hosts-2ranks-lo10gbit 2 \
  nccl,smdccl,smdccl+fp16,smdccl+int8 100 PY="$PY" NCCL_SOCKET_IFNAME=lo scripts/shaped_loopback.sh 10 --
tc qdisc show dev lo 2> /dev/null | grep -q tbf && tc qdisc del dev lo root
# Unshaped: the host's copies and CPU decide.
nccl_bench nccl-hosts-2ranks 2 nccl,smdccl,smdccl+fp16,gloo 90
nccl_bench nccl-hosts-4ranks 4 nccl,smdccl,smdccl+fp16,gloo 110
nccl_bench nccl-hosts-2x2 4 nccl,smdccl,smdccl+fp16 70 SMDCCL_TOPOLOGY=2x2

# The staged path across nodes: 64 MB with the fp16 wire packed on the GPU
# beside float32 staging and gloo, with PCIe bytes (halved) and the progress
# thread's CPU time per call; one rank per node, then the inter-node step of
# the two-level allreduce (2x2).
for layout in 2x1 2x2; do
  n=$([ "$layout" = 2x1 ] && echo 2 || echo 4)
  SMDCCL_TOPOLOGY=$layout run_step "staged-bench-$layout" 90 "$PY" -m torch.distributed.run \
    --nproc-per-node "$n" scripts/cuda_staged_bench.py --sizes 4M,64M --json "$LOGS/staged-bench-$layout.json" \
    > "$LOGS/staged-bench-$layout.txt" 2>&1 || tail -20 "$LOGS/staged-bench-$layout.txt"
  grep "^#.*x float32 staging" "$LOGS/staged-bench-$layout.txt"
done
# reduce_scatter_tensor (FSDP's gradients) across nodes, the same comparison.
SMDCCL_TOPOLOGY=2x2 run_step staged-bench-rs 90 "$PY" -m torch.distributed.run \
  --nproc-per-node 4 scripts/cuda_staged_bench.py --collective reduce_scatter --sizes 4M,64M \
  --json "$LOGS/staged-bench-rs.json" > "$LOGS/staged-bench-rs.txt" 2>&1 || tail -20 "$LOGS/staged-bench-rs.txt"
grep "^#.*x float32 staging" "$LOGS/staged-bench-rs.txt"
# 100 async 4 KB allreduces across nodes against one.
SMDCCL_TOPOLOGY=2x2 run_step burst-bench 60 "$PY" -m torch.distributed.run --nproc-per-node 4 \
  scripts/cuda_staged_bench.py --collective burst --sizes 4K --iters 5 \
  --json "$LOGS/burst-bench.json" > "$LOGS/burst-bench.txt" 2>&1 || tail -20 "$LOGS/burst-bench.txt"
grep -A5 "^#.*burst" "$LOGS/burst-bench.txt"

# The same comparison between emulated nodes joined by a shaped 10 Gbit/s
# link (network namespaces, where this machine allows them).
if grep -qx "netns yes" "$LOGS/probe.txt"; then
  run_step cluster-10gbit 120 "$PY" -m smdccl.cluster --nodes 2 --procs-per-node 1 --link 10gbit \
    --env NCCL_SOCKET_IFNAME=eth0 -- -m smdccl.bench --device cuda --nccl-ranks-as-hosts \
    --backends nccl,smdccl,smdccl+fp16 --collectives allreduce --sizes 4K,1M,64M --target-time 0.2 \
    --json "$LOGS/cluster-10gbit.json" --no-progress > "$LOGS/cluster-10gbit.txt" 2>&1 ||
    tail -20 "$LOGS/cluster-10gbit.txt"
fi

ITERS=()
[[ $QUICK == 1 ]] && ITERS=(--quick)
run_step kernel-bench 90 "$BUILD/smdccl_cuda_kernel_bench" "${ITERS[@]}" --json "$LOGS/kernels.json" \
  > "$LOGS/kernels.txt" 2>&1 || tail -5 "$LOGS/kernels.txt"

BACKENDS=smdccl,gloo
[[ $NGPU -ge 2 ]] && BACKENDS=smdccl,gloo,nccl
SIZES=${SMDCCL_GPU_CHECK_SIZES:-4K,64K,256K,1M,4M,16M,64M}
COLLS=${SMDCCL_GPU_CHECK_COLLECTIVES:-allreduce,allgather,reduce_scatter,broadcast}
bench() {  # bench NAME RANKS COLLECTIVES CAP
  run_step "$1" "$4" "$PY" -m torch.distributed.run --nproc-per-node "$2" -m smdccl.bench --device cuda \
    --backends "$BACKENDS" --collectives "$3" --sizes "$SIZES" --json "$LOGS/$1.json" --no-progress \
    > "$LOGS/$1.txt" 2>&1 || tail -20 "$LOGS/$1.txt"
}
# Every collective on CUDA tensors, one node (CUDA IPC), beside gloo; the
# 2-rank allreduce holds the 3x-gloo target.
bench collectives-2ranks 2 "$COLLS" 150
for n in ${SMDCCL_GPU_CHECK_RANKS:-4}; do
  [[ $n == 2 ]] && continue  # done above
  bench "collectives-${n}ranks" "$n" "$COLLS" 150
done
steps_failed && status=1

# 3. report
echo "gpu_check: steps (name rc seconds):"; cat "$LOGS/steps.txt"
"$PY" scripts/gpu_report.py --logs "$LOGS" --stem "$STEM" --status $status || status=1
cat "$STEM.md"
echo "gpu_check: done in $(( SECONDS - START )) s, status $status"
exit $status
