#!/usr/bin/env bash
# The project's test command: sets itself up on a fresh machine (a tools venv
# with nox, uv and pre-commit, then one uv venv per SGLang release, each
# installed from PyPI), runs the style hooks, the full suite on one release
# of each behaviour class and the smoke set on every other release.
# Venvs live outside the checkout so that later runs on the same machine
# reuse them; a fresh machine builds them. Extra arguments go to nox.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SGLANG_DSPARK_DP_CACHE:-$HOME/.cache/sglang-dspark-dp}"
TOOLS="$CACHE/tools"
PY="${PYTHON:-python3}"
if [ ! -x "$TOOLS/bin/nox" ] || [ ! -x "$TOOLS/bin/pre-commit" ] || [ ! -x "$TOOLS/bin/uv" ]; then
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "nox>=2025.2" "uv>=0.8" "pre-commit>=3.5"
fi
export PATH="$TOOLS/bin:$PATH"
export PRE_COMMIT_HOME="$CACHE/pre-commit"
cd "$ROOT"
# nox's status is the result: a session that ran no test fails.
exec nox --envdir "$CACHE/nox" "$@"
