"""Helpers shared by the regression suite's test modules."""

from __future__ import annotations

import os
import subprocess
import sys


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 240):
    """Run ``code`` in a fresh interpreter (a fresh plugin load)."""
    full_env = dict(os.environ)
    full_env.pop("SGLANG_PLUGINS", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=full_env,
    )


#: One line per soak run, printed at the end of the pytest session.
SOAK_SUMMARIES: list[str] = []
