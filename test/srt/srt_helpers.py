"""Helpers shared by the regression suite's test modules."""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

_SERVER = Path(__file__).with_name("forkserver.py")
_lock = threading.Lock()
_server: subprocess.Popen | None = None


def _forkserver() -> subprocess.Popen:
    """The session's fork server (see ``forkserver.py``), started on first use."""
    global _server
    if _server is None or _server.poll() is not None:
        env = dict(os.environ)
        env.pop("SGLANG_PLUGINS", None)
        _server = subprocess.Popen(
            [sys.executable, str(_SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        ready = _server.stdout.readline()
        if not ready.startswith('{"ready"'):
            raise RuntimeError(f"the fork server did not start: {ready!r}")
        atexit.register(_server.kill)
    return _server


def run_python(code: str, env: dict[str, str] | None = None, timeout: float = 240):
    """Run ``code`` as ``python -c`` would, in a fresh process that has
    imported SGLang and nothing of the plugin (a fork of the session's fork
    server): a fresh plugin load, without paying for SGLang's import again.
    Returns what ``subprocess.run`` would (returncode, stdout, stderr)."""
    request = {"code": code, "env": dict(env or {}), "timeout": timeout}
    with _lock:
        server = _forkserver()
        server.stdin.write(json.dumps(request) + "\n")
        server.stdin.flush()
        line = server.stdout.readline()
    if not line:
        raise RuntimeError("the fork server died")
    answer = json.loads(line)
    return subprocess.CompletedProcess(
        [sys.executable, "-c", code],
        answer["returncode"],
        answer["stdout"],
        answer["stderr"],
    )


CLI = "import sys; from sglang_dspark_dp.cli import main; sys.exit(main({argv!r}))"


def cli(argv, **env):
    """``sglang-dspark-dp ARGV`` in a fresh process (see :func:`run_python`)."""
    return run_python(CLI.format(argv=list(argv)), env=env)


#: ``verify`` arguments of the short runs every release gets.
SHORT_VERIFY = ["verify", "--steps", "60", "--dp", "2", "--no-progress"]


def no_children_left() -> bool:
    """Whether every rank process a harness started has ended (10 s grace)."""
    import multiprocessing as mp
    import time

    deadline = time.monotonic() + 10
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not mp.active_children()


@contextlib.contextmanager
def restored(repair):
    """Leave ``repair`` instrumented or not, as the test found it."""
    was = repair.instrumented
    try:
        yield repair
    finally:
        if was:
            repair.instrument(apply=True)
        else:
            repair.uninstrument()


#: One line per soak run, printed at the end of the pytest session.
SOAK_SUMMARIES: list[str] = []


def enabled_or_skip(repair, version: str):
    """Instrument ``repair`` and return its status: a test of the repaired
    behaviour needs it enabled. Where ``known_releases`` says the release
    needs it, anything else fails (a repair that switched itself off is a
    failure, not a skip); where the release does not need it, the test has
    nothing to check and skips, saying so."""
    import pytest
    from known_releases import backport_fixes, needs

    status = repair.instrument(apply=True)
    wanted = needs(version)
    if wanted is None:
        pytest.fail(f"sglang {version} has no row in known_releases.py")
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    if wanted[repair.name]:
        if not status.enabled:
            pytest.fail(
                f"{repair.name} must be enabled on sglang {version}: {status.line()}"
            )
        return status
    pytest.skip(f"sglang {version} does not need {repair.name}: {status.line()}")
