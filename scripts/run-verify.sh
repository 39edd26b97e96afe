#!/usr/bin/env bash
# The project's main job on a bare CPU machine: sets itself up (a venv with
# SGLang from PyPI and this package), then runs `sglang-dspark-dp verify`:
# 4 simulated DP ranks, real DSpark draft code, no GPU, no model.
#   SGLANG_VERSION=0.5.23 bash scripts/run-verify.sh --steps 500
# Arguments go to `verify` (see `sglang-dspark-dp verify --help`).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${SGLANG_VERSION:-0.5.16}"
CACHE="${SGLANG_DSPARK_DP_CACHE:-$HOME/.cache/sglang-dspark-dp}"
VENV="$CACHE/verify-sglang-$VERSION"
PY="${PYTHON:-python3}"
if [ ! -x "$VENV/bin/sglang-dspark-dp" ] || ! "$VENV/bin/python" -c "import sglang" 2>/dev/null; then
  echo "setting up $VENV (sglang==$VERSION from PyPI; a few minutes the first time)" >&2
  "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q "sglang==$VERSION"
fi
"$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"
exec "$VENV/bin/sglang-dspark-dp" verify "$@"
