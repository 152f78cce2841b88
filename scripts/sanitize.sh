#!/usr/bin/env bash
# Builds smdccl with AddressSanitizer + UndefinedBehaviorSanitizer
# (-DSMDCCL_SANITIZE=ON) in its own directory and runs, under them, the C++
# core tests and the pytest suite. Exits non-zero on any test failure and on
# any sanitizer report (ASan reports are collected in files, so one in a
# process nobody checks still counts; UBSan stops the process at the first
# report, failing its test, and its "runtime error:" lines are looked for too).
#
#   scripts/sanitize.sh                  # everything: tests -q
#   scripts/sanitize.sh tests/test_faults.py -x    # pytest arguments instead
#
# Nothing is installed: the engine goes to $SMDCCL_SANITIZE_DIR/py/smdccl
# (default build/sanitize/ in the checkout, ignored by git) next to a copy of
# python/smdccl, and PYTHONPATH points there; the installed smdccl is not
# touched. The spawned ranks of tests/harness.py inherit the environment, so
# they import this build too (checked below through _C.build_info()).
#
# Python itself is not instrumented, so the ASan runtime is LD_PRELOADed,
# together with libstdc++: python does not link libstdc++, and ASan's
# __cxa_throw interceptor, resolved when the runtime starts, would otherwise
# find no real __cxa_throw and abort at the first C++ throw ("CHECK failed:
# real___cxa_throw"). The preload reaches every process the tests start (ip,
# cmake, gcc...); reports in those are not ours and scripts/asan.supp
# suppresses the ones seen. Leak checking is off under Python (the
# interpreter frees little at exit); the C++ core tests run with it on.
#
# Environment: SMDCCL_SANITIZE_DIR (build dir), SMDCCL_BUILD_JOBS (default:
# cores), SMDCCL_TEST_RUN_TIMEOUT / SMDCCL_TEST_TIMEOUT (harness and per-test
# limits; raised here by default, sanitized ranks run slower).
# Wall times on the 2-core development VM: build 3.5 min from scratch (1 min
# after a change in the engine), C++ core tests < 1 s, pytest suite 12.8 min
# (182 tests; the unsanitized build took 12.1 min on the same, shared, VM:
# rank start-up, sleeps and timeouts dominate, not the engine).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
OUT=${SMDCCL_SANITIZE_DIR:-$ROOT/build/sanitize}
JOBS=${SMDCCL_BUILD_JOBS:-$(nproc)}
PY=${PYTHON:-python}
REPORTS=$OUT/reports
PYTEST_ARGS=("$@")
[ ${#PYTEST_ARGS[@]} -gt 0 ] || PYTEST_ARGS=(tests -q)

say() { printf '\n== sanitize.sh: %s\n' "$*" >&2; }
now() { date +%s; }
T0=$(now)

# ---------------------------------------------------------------- build
say "building with -DSMDCCL_SANITIZE=ON in $OUT/build"
mkdir -p "$OUT/py/smdccl"
TORCH_CMAKE=$("$PY" -c 'import torch; print(torch.utils.cmake_prefix_path)')
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S "$ROOT" -B "$OUT/build" "${GEN[@]}" \
  -DSMDCCL_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_PREFIX_PATH="$TORCH_CMAKE" -DPython3_EXECUTABLE="$(command -v "$PY")" \
  -DSMDCCL_PYTHON_OUT_DIR="$OUT/py/smdccl" >"$OUT/cmake.log" 2>&1 \
  || { cat "$OUT/cmake.log" >&2; exit 1; }
cmake --build "$OUT/build" -j "$JOBS"   # _C and smdccl_core_tests
# The package beside the engine: a fresh copy of python/smdccl (not links:
# tests resolve smdccl.__file__ and must stay in this tree).
find "$OUT/py/smdccl" -mindepth 1 -maxdepth 1 ! -name '_C*.so' -exec rm -rf {} +
(cd "$ROOT/python/smdccl" && tar --exclude='*.so' --exclude=__pycache__ -cf - .) \
  | (cd "$OUT/py/smdccl" && tar -xf -)
T_BUILD=$(( $(now) - T0 ))

# ---------------------------------------------------------------- environment
ASAN_LIB=$(gcc -print-file-name=libasan.so)
STDCXX_LIB=$(gcc -print-file-name=libstdc++.so)
for lib in "$ASAN_LIB" "$STDCXX_LIB"; do
  [ -e "$lib" ] || { echo "sanitize.sh: $lib not found (gcc -print-file-name)" >&2; exit 1; }
done
rm -rf "$REPORTS" && mkdir -p "$REPORTS"
SAN_ASAN="abort_on_error=1:suppressions=$ROOT/scripts/asan.supp:log_path=$REPORTS/asan"
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# ---------------------------------------------------------------- C++ core tests
say "C++ core tests (ASan with leak checking, UBSan)"
T1=$(now)
CORE_RC=0
ASAN_OPTIONS="detect_leaks=1:$SAN_ASAN" "$OUT/build/smdccl_core_tests" || CORE_RC=$?
T_CORE=$(( $(now) - T1 ))

# ---------------------------------------------------------------- pytest
export LD_PRELOAD="$ASAN_LIB $STDCXX_LIB${LD_PRELOAD:+ $LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:$SAN_ASAN"
export PYTHONPATH="$OUT/py${PYTHONPATH:+:$PYTHONPATH}"
export SMDCCL_TEST_RUN_TIMEOUT=${SMDCCL_TEST_RUN_TIMEOUT:-900}
export SMDCCL_TEST_TIMEOUT=${SMDCCL_TEST_TIMEOUT:-1800}
export SMDCCL_TEST_TIMEOUT_SCALE=${SMDCCL_TEST_TIMEOUT_SCALE:-4}

"$PY" - "$OUT" <<'EOF'
import sys
import smdccl
from smdccl import _C
out = sys.argv[1]
assert smdccl.__file__.startswith(out), f"imported {smdccl.__file__}, not the build in {out}"
assert _C.build_info()["sanitizers"] == "address,undefined", _C.build_info()
print(f"sanitize.sh: engine {_C.__file__} ({_C.build_info()['sanitizers']})", file=sys.stderr)
EOF

say "pytest ${PYTEST_ARGS[*]} (sanitized engine, in $ROOT)"
T2=$(now)
set +e
(cd "$ROOT" && "$PY" -m pytest "${PYTEST_ARGS[@]}") 2>&1 | tee "$OUT/pytest.log"
PYTEST_RC=${PIPESTATUS[0]}
set -e
T_PYTEST=$(( $(now) - T2 ))

# ---------------------------------------------------------------- verdict
unset LD_PRELOAD
FAIL=0
shopt -s nullglob
reports=("$REPORTS"/*)
if [ ${#reports[@]} -gt 0 ]; then
  say "${#reports[@]} AddressSanitizer report(s):"
  for f in "${reports[@]}"; do echo "---- $f" >&2; head -c 20000 "$f" >&2; done
  FAIL=1
fi
UB=$(grep -c "runtime error:" "$OUT/pytest.log" || true)
if [ "$UB" -gt 0 ]; then
  say "$UB UBSan report line(s) in the pytest output:"
  grep "runtime error:" "$OUT/pytest.log" | sort | uniq -c >&2
  FAIL=1
fi
[ "$CORE_RC" -eq 0 ] || FAIL=1
[ "$PYTEST_RC" -eq 0 ] || FAIL=1
say "wall times: build ${T_BUILD} s, C++ core tests ${T_CORE} s, pytest ${T_PYTEST} s;" \
    "core tests rc=$CORE_RC, pytest rc=$PYTEST_RC, ASan reports ${#reports[@]}, UBSan lines $UB"
exit $FAIL
