#!/usr/bin/env bash
# Build smdccl against a given torch release in a fresh virtual environment
# and run a quick part of the suite there: the check that the oldest torch
# smdccl supports (docs/development.md) still builds and works.
#
#   scripts/torch_range.sh              # the oldest supported: torch 2.11.0
#   scripts/torch_range.sh 2.13.0 2.15.0
#
# Each version: a venv under ${SMDCCL_RANGE_DIR:-/tmp/smdccl-torch-range}/<v>
# (kept, so a second run reuses the install), a build of its own (the build
# directory of the checkout is not touched: the source is copied), then
# SMDCCL_RANGE_TESTS (default below) with pytest. Exit code: the number of
# versions that failed. A summary line per version goes to stdout.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
versions=("$@")
[ ${#versions[@]} -eq 0 ] && versions=(2.11.0)
base="${SMDCCL_RANGE_DIR:-/tmp/smdccl-torch-range}"
tests="${SMDCCL_RANGE_TESTS:-tests/test_autoload.py tests/test_readme.py tests/test_collectives.py tests/test_cluster.py::test_torchrun_command_line tests/test_ddp.py tests/test_fsdp.py tests/test_split_group.py}"
failed=0
summary=()
for v in "${versions[@]}"; do
  dir="$base/$v"
  log="$dir/log.txt"
  mkdir -p "$dir"
  echo "== torch $v: $dir (log $log)"
  (
    set -e
    [ -x "$dir/venv/bin/python" ] || python3 -m venv "$dir/venv"
    # shellcheck disable=SC1091
    source "$dir/venv/bin/activate"
    pip install "torch==$v" "setuptools>=70.1" pytest numpy
    rm -rf "$dir/src" && mkdir -p "$dir/src"
    git -C "$root" ls-files -z --cached --others --exclude-standard \
      | (cd "$root" && xargs -0 cp --parents -t "$dir/src")
    cd "$dir/src"
    pip install --no-build-isolation .
    python -c "import torch, smdccl; print('built against torch', torch.__version__)"
    # shellcheck disable=SC2086
    python -m pytest $tests -q
  ) >"$log" 2>&1
  rc=$?
  line="$(grep -E '^[0-9]+ (passed|failed)|error' "$log" | tail -1)"
  if [ $rc -eq 0 ]; then
    summary+=("torch $v: ok ($line)")
  else
    failed=$((failed + 1))
    summary+=("torch $v: FAILED rc=$rc ($line); see $log")
    tail -30 "$log"
  fi
done
printf '%s\n' "${summary[@]}"
exit $failed
