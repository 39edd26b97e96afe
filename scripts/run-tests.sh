#!/usr/bin/env bash
# The project's test command: sets itself up on a fresh machine (a tools venv
# with nox and pre-commit, then one venv per SGLang release, each installed
# from PyPI), runs the style hooks and the suite on every release.
# Venvs live outside the checkout so that later runs on the same machine
# reuse them; a fresh machine builds them. Extra arguments go to nox.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${SGLANG_DSPARK_DP_CACHE:-$HOME/.cache/sglang-dspark-dp}"
TOOLS="$CACHE/tools"
PY="${PYTHON:-python3}"
if [ ! -x "$TOOLS/bin/nox" ] || [ ! -x "$TOOLS/bin/pre-commit" ]; then
  "$PY" -m venv "$TOOLS"
  "$TOOLS/bin/python" -m pip install -q "nox>=2024.4" "pre-commit>=3.5"
fi
export PATH="$TOOLS/bin:$PATH"
export PRE_COMMIT_HOME="$CACHE/pre-commit"
cd "$ROOT"
# nox's status is the result: a session that ran no test fails.
exec nox --envdir "$CACHE/nox" "$@"
