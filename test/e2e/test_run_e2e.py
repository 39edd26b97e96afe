"""e2e/run_e2e.sh's own guards, run for real on the CPU (no server starts).

The script is driven with this interpreter (it has SGLang and the benchmark
package, which the script imports before any part) and a site path of its
own, so that nothing needs the device's unpacked batches.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "run_e2e.sh"


def _run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPT), "--gpus", "1", "--python", sys.executable]
    cmd += ["--sglang-site", os.pathsep.join(sys.path[1:]), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(
    "args, field, value",
    [
        (["--only", "warm-up"], "--only", "warm-up"),
        (["--rounds", "0"], "--rounds", "0"),
        (["--rounds", "three"], "--rounds", "three"),
    ],
)
def test_bad_input_is_one_line_naming_the_field(tmp_path, args, field, value):
    done = _run("--out", str(tmp_path), *args, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and f"'{value}'" in lines[0]


def test_a_server_left_by_a_cut_call_is_stopped_before_the_port_check(tmp_path):
    """A cut call's server (its process group recorded in OUT) is stopped by
    the next part, and a port still taken by anything else is refused, with
    the part's rows saying why instead of checks run against a stranger."""
    out = tmp_path / "e2e"
    out.mkdir()
    stale = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (out / "server.pgid").write_text(f"{stale.pid}\n")
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    try:
        done = _run(
            "--out", str(out), "--only", "warmup", "--port", str(port), "--no-doctor"
        )
        deadline = time.monotonic() + 10
        while stale.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert stale.poll() is not None, "the stale server's group was left running"
        assert not (out / "server.pgid").exists()
        assert "stopping the server left by an earlier call" in done.stderr
        assert done.returncode == 1, done.stderr[-2000:]
        rows = json.loads((out / "rows-warmup.json").read_text())["checks"]
        assert [(r["check"], r["status"]) for r in rows] == [
            ("warmup: /health (server ready)", "not run")
        ]
        assert f"port {port} was already in use" in rows[0]["evidence"]
        assert not (out / "server_warmup.log").exists()
    finally:
        stranger.close()
        if stale.poll() is None:
            stale.kill()
        stale.wait()
