#!/usr/bin/env bash
# PyTorch's distributed tests, functional collectives and DTensor against the
# installed smdccl (docs/conformance.md); arguments go to the driver, e.g.
#   scripts/torch_conformance.sh --world-sizes 2 -k all_gather
set -euo pipefail
exec "${PYTHON:-python}" "$(dirname "$0")/torch_conformance.py" "$@"
