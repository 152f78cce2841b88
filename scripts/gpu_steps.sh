# Step runner of scripts/gpu_check.sh (sourced; tests/test_gpu_check_steps.py
# drives it with a budget of seconds). Expects: LOGS (folder), START (the
# $SECONDS the budget counts from), BUDGET, REPORT_RESERVE and MIN_STEP
# (seconds), PY, fd 3 open for the console, and status (set to 1 on a failure).
# Each step appends "name rc seconds" to $LOGS/steps.txt; rc is the exit code
# (124: stopped by its limit), "skipped" (SMDCCL_GPU_CHECK_SKIP) or "not-run"
# (less than MIN_STEP seconds of the budget left) or "n/a" (an exit code in
# STEP_NA: the machine cannot run it, e.g. no tc to shape lo).
# SMDCCL_GPU_CHECK_RESUME=1 continues an earlier command's check in the same
# LOGS: a step that has a result there (not not-run or skipped) is not run again,
# so a check that needs more than one 10-minute command is run again as is.

# kill_step_leftovers TAG: SIGKILLs the processes a step left behind. Test
# ranks and torchrun's workers run in sessions of their own, which the limit's
# signal does not reach; they inherit the step's SMDCCL_GPU_CHECK_STEP tag
# from their environment, so only this step's are killed (not those of
# another run on the machine).
kill_step_leftovers() {
  local p
  for p in /proc/[0-9]*; do
    grep -qsxz "SMDCCL_GPU_CHECK_STEP=$1" "$p/environ" && kill -9 "${p#/proc/}" 2>/dev/null
  done
  return 0
}

# run_step NAME CAP CMD...: runs CMD under min(CAP, budget left) and records
# it; an exit code other than 0 (or those in STEP_ALSO_OK) fails the check.
# STEP_RESERVE (seconds) is kept from this step for the steps after it (steps
# started side by side all see the same budget left).
run_step() {
  local name=$1 cap=$2; shift 2
  if [[ " ${SMDCCL_GPU_CHECK_SKIP:-} " == *" $name "* ]]; then
    echo "$name skipped 0" >> "$LOGS/steps.txt"; return 0
  fi
  if [[ "${SMDCCL_GPU_CHECK_RESUME:-0}" == 1 ]] &&
     awk -v n="$name" '$1 == n && $2 != "not-run" && $2 != "skipped" {found=1} END {exit !found}' "$LOGS/steps.txt"; then
    echo "gpu_check: $name has a result from an earlier command: not run again" >&3
    return 0
  fi
  local left=$(( BUDGET - REPORT_RESERVE - ${STEP_RESERVE:-0} - (SECONDS - START) ))
  local limit=$(( cap < left ? cap : left ))
  if (( limit < MIN_STEP )); then
    echo "gpu_check: $name not run: ${left} s of the budget left" >&3
    echo "$name not-run 0" >> "$LOGS/steps.txt"; status=1; return 1
  fi
  local t0=$SECONDS rc
  # pytest ends its running test itself 10 s before the limit (conftest's
  # SMDCCL_TEST_DEADLINE), so the harness kills its ranks and the JUnit file
  # still gets written; the limit is the backstop.
  local tag="$name-$$-$RANDOM"
  SMDCCL_GPU_CHECK_STEP=$tag SMDCCL_TEST_DEADLINE=$(( $(date +%s) + limit - 10 )) \
    timeout --kill-after=10 "$limit" "$@"; rc=$?
  if (( rc == 124 || rc == 137 )); then
    kill_step_leftovers "$tag"
    rc=124
  fi
  local recorded=$rc
  [[ " ${STEP_NA:-} " == *" $rc "* ]] && recorded=n/a
  echo "$name $recorded $(( SECONDS - t0 ))" >> "$LOGS/steps.txt"
  echo "gpu_check: $name rc=$rc in $(( SECONDS - t0 )) s (limit $limit s)" >&3
  [[ " 0 ${STEP_ALSO_OK:-} ${STEP_NA:-} " == *" $rc "* ]] || status=1
  return $rc
}

# pytest_step NAME CAP KEXPR PYTEST-ARGS...: one pytest run with its own log and
# JUnit file (test_cuda-NAME.xml, which the report reads); KEXPR is its -k
# expression ("" for none), narrowed by SMDCCL_GPU_CHECK_TESTS. Exit code 5
# (that expression left no test in this step) is not a failure.
pytest_step() {
  local name=$1 cap=$2 k=$3; shift 3
  [[ -n "${SMDCCL_GPU_CHECK_TESTS:-}" ]] && k="${k:+($k) and }(${SMDCCL_GPU_CHECK_TESTS})"
  local args=(-q -rfEs --durations=0 --junitxml="$LOGS/test_cuda-$name.xml" "$@")
  [[ -n "$k" ]] && args+=(-k "$k")
  PYTHONUNBUFFERED=1 STEP_ALSO_OK=5 run_step "$name" "$cap" "$PY" -m pytest "${args[@]}" \
    > "$LOGS/test_cuda-$name.txt" 2>&1
  tail -4 "$LOGS/test_cuda-$name.txt"
}

# steps_failed: whether a step recorded in $LOGS/steps.txt failed (steps run in
# the background cannot set status themselves). Passing: 0, pytest's 5 (no
# test selected), skipped, n/a; where a step ran more than once (a resumed check),
# its last line counts.
steps_failed() {
  awk '{rc[$1] = $2} END {for (n in rc) if (rc[n] != "0" && rc[n] != "5" && rc[n] != "skipped" && rc[n] != "n/a") bad = 1; exit !bad}' \
    "$LOGS/steps.txt"
}
