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


def _run(
    *args: str,
    timeout: float = 240,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPT), "--gpus", "1", "--python", python]
    cmd += ["--sglang-site", os.pathsep.join(sys.path[1:]), *args]
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


#: A part that must not wait for a port or a server: a second each.
QUICK = {"E2E_PORT_WAIT": "1", "E2E_HEALTH_TIMEOUT": "5"}


def _parts(out, port: int, *parts: str, python: str, doctor: bool = True):
    """run_e2e.sh for ``parts`` into ``out`` on ``port``, quickly (:data:`QUICK`)."""
    args = ["--out", str(out), "--port", str(port)]
    for part in parts:
        args += ["--only", part]
    if not doctor:
        args.append("--no-doctor")
    return _run(*args, python=python, env=QUICK)


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


def _python_with_a_doctor_that_logs(tmp_path: Path) -> str:
    """This interpreter, except for doctor, whose two streams it stands in
    for (the real doctor takes a minute of SGLang import here): a plugin log
    line on stderr while the JSON goes to stdout, as the real one does."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1 $2 $3" == "-m sglang_dspark_dp.cli doctor" ]]; then\n'
        "  echo '[t] sglang-dspark-dp: draft-batch: enabled' >&2\n"
        '  echo \'{"repairs": ["draft-batch"]}\'\n'
        "  exit 0\n"
        "fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return str(fake)


def test_a_server_left_by_a_cut_call_is_stopped_before_the_port_check(tmp_path):
    """A cut call's server (its process group recorded in OUT) is stopped by
    the next part, and a port still taken by anything else is refused, with
    the part's rows saying why instead of checks run against a stranger.
    Before the parts, doctor's JSON and its log lines land in two files
    (on 2026-12-05 and 12-07 doctor.json began with the log lines)."""
    out = tmp_path / "e2e"
    out.mkdir()
    stale = subprocess.Popen(["sleep", "300"], start_new_session=True)
    (out / "server.pgid").write_text(f"{stale.pid}\n")
    stranger = socket.socket()
    stranger.bind(("127.0.0.1", 0))
    stranger.listen()
    port = stranger.getsockname()[1]
    try:
        done = _parts(
            out, port, "warmup", python=_python_with_a_doctor_that_logs(tmp_path)
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
            ("warmup: /health (server ready, plugin off)", "not run")
        ]
        assert f"port {port} was already in use" in rows[0]["evidence"]
        assert "taken: a listener answers after" in rows[0]["evidence"]
        assert not list(out.glob("server_*.log"))
        doctor = json.loads((out / "doctor.json").read_text())
        assert doctor == {"repairs": ["draft-batch"]}
        assert "draft-batch: enabled" in (out / "doctor.log").read_text()
    finally:
        stranger.close()
        if stale.poll() is None:
            stale.kill()
        stale.wait()


def _python_with_a_stand_in_server(tmp_path: Path) -> str:
    """This interpreter, except for two of the script's steps: the server,
    which prints one line and exits (no GPU here), and the import check
    before the parts, which passes (run for real it takes about a minute
    here, and a socket's TIME_WAIT lasts one)."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        'if [[ "$1" == -c && "$2" == *"from sglang.cli.main import main"* ]]; then\n'
        "  echo 'stand-in server: started'; exit 3\n"
        "fi\n"
        'if [[ "$1" == -c && "$2" == "import sglang.cli.main, "* ]]; then exit 0; fi\n'
        f'exec {sys.executable} "$@"\n'
    )
    fake.chmod(0o755)
    return str(fake)


def test_a_port_in_time_wait_is_not_refused(tmp_path, time_wait_port):
    """2026-12-07, call 6: the part that followed another was refused
    ("port 31000 is already in use") by sockets the stopped server left in
    TIME_WAIT, with no server running. The server binds with SO_REUSEADDR
    and so does the check now: the part starts its server."""
    out = tmp_path / "e2e"
    port = time_wait_port()
    done = _parts(
        out,
        port,
        "warmup",
        python=_python_with_a_stand_in_server(tmp_path),
        doctor=False,
    )
    assert f"run_e2e.sh: [ok] port: port {port}: free but closing (TIME_WAIT)" in (
        done.stderr
    ), done.stderr[-2000:]
    assert "already in use" not in done.stderr
    rows = json.loads((out / "rows-warmup.json").read_text())["checks"]
    # Both kernel sets: a plugin-off server, then a plugin-on one.
    assert [(r["check"], r["status"]) for r in rows] == [
        ("warmup: /health (server ready, plugin off)", "failed"),
        ("warmup: /health (server ready, plugin on)", "failed"),
    ]
    for variant, plugins in (("off", "SGLANG_PLUGINS=e2e_init "), ("on", "")):
        log = (out / f"server_warmup_{variant}.log").read_text()
        assert "stand-in server: started" in log
        assert log.startswith(f"+ {plugins}sglang serve "), log
        assert "--speculative-algorithm DSPARK" in log


def test_the_plugin_server_runs_with_the_watch_on(tmp_path, time_wait_port):
    """The dspark part's server (plugin on) starts with SGLang's consensus
    switch set, so the plugin's watch runs on every multi-GPU e2e; the
    plugin-off server does not."""
    out = tmp_path / "e2e"
    done = _parts(
        out,
        time_wait_port(),
        "dspark",
        "noplugin",
        python=_python_with_a_stand_in_server(tmp_path),
        doctor=False,
    )
    assert "stand-in server: started" in (out / "server_dspark.log").read_text()
    on = (out / "server_dspark.log").read_text()
    assert on.startswith("+ SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1 sglang serve "), on
    off = (out / "server_noplugin.log").read_text()
    assert "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER" not in off, off
    assert done.returncode == 0, done.stderr[-2000:]
