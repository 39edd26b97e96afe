#!/usr/bin/env bash
# The project's main job on a bare CPU machine: sets itself up (uv, then a
# venv with SGLang from PyPI and this package), then runs
# `sglang-dspark-dp verify`: 4 simulated DP ranks, real DSpark draft code, no
# GPU, no model.
#   SGLANG_VERSION=0.5.23 bash scripts/run-verify.sh --steps 500
# Arguments go to `verify` (see `sglang-dspark-dp verify --help`).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VERSION="${SGLANG_VERSION:-0.5.16}"
CACHE="${SGLANG_DSPARK_DP_CACHE:-$HOME/.cache/sglang-dspark-dp}"
TOOLS="$CACHE/tools"
VENV="$CACHE/verify-sglang-$VERSION"
PY="${PYTHON:-python3}"
if [ ! -x "$TOOLS/bin/uv" ]; then
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "uv>=0.8"
fi
UV="$TOOLS/bin/uv"
if [ ! -x "$VENV/bin/sglang-dspark-dp" ] || ! "$VENV/bin/python" -c "import sglang" 2>/dev/null; then
  echo "setting up $VENV (sglang==$VERSION from PyPI with uv; a minute or two the first time)" >&2
  "$UV" venv -q --python "$PY" "$VENV"
  # 0.5.18-0.5.22 pin cuda-tile, a download-only stub whose index these
  # machines cannot reach and that nothing imports; excluding it is a no-op
  # for the releases that do not pin it.
  echo cuda-tile > "$VENV/excludes.txt"
  "$UV" pip install -q --python "$VENV/bin/python" --excludes "$VENV/excludes.txt" "sglang==$VERSION"
fi
"$UV" pip install -q --python "$VENV/bin/python" --no-deps -e "$ROOT"
# diverge's one requirement (the plugin's `diverge` extra, pinned there).
"$UV" pip install -q --python "$VENV/bin/python" -e "$ROOT[diverge]"
exec "$VENV/bin/sglang-dspark-dp" verify "$@"
