"""Launch, health-check and stop the server processes of the matrix.

A :class:`Server` runs its command in its own session (process group) with the
output in a log file, :meth:`Server.wait_healthy` polls ``/health`` and
:meth:`Server.stop` takes the whole group down (SIGTERM, then SIGKILL).
:func:`port_in_use` guards against measuring a server this run did not start.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

LOG_TAIL_LINES = 60


class ServerFailed(Exception):
    """The server could not be started, exited, or never became healthy."""


def http_get(url: str, timeout: float) -> tuple[int, str]:
    """``(status, body)`` of a GET; raises ``urllib`` / ``OSError`` errors."""
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return resp.status, resp.read().decode("utf-8", "replace")


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) == 0


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def group_alive(pgid: int) -> bool:
    """True while a live (non-zombie) process is in process group ``pgid``."""
    proc = Path("/proc")
    if proc.is_dir() and (proc / "self" / "stat").exists():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rfind(")") + 2 :].split()
            if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
                return True
        return False
    try:  # not Linux: zombies count as alive here
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


class Server:
    """A server launched in its own session; always stop() it in a finally."""

    def __init__(self, command: list[str], env: dict[str, str], log_path: Path):
        self.command = command
        self.log_path = log_path
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        try:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **env},
                start_new_session=True,
            )
        except OSError as exc:
            self._log.close()
            raise ServerFailed(
                f"cannot start server command {command[0]!r}: {exc}"
            ) from exc
        self.pgid = self.proc.pid  # leader of its own session / process group

    def exited(self) -> int | None:
        """The exit code once the server process has ended, else None."""
        return self.proc.poll()

    def wait_healthy(self, base_url: str, timeout: float) -> float:
        """Seconds until ``/health`` answered 200; :class:`ServerFailed` if not."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerFailed(
                    f"server exited with code {code} before /health answered"
                )
            try:
                status, _ = http_get(f"{base_url}/health", timeout=5.0)
                if status == 200:
                    return time.monotonic() - started
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise ServerFailed(
                    f"server did not answer {base_url}/health within {timeout:g} s"
                )
            time.sleep(0.2 if timeout < 30 else 2.0)

    def stop(self, grace: float) -> dict[str, Any]:
        """SIGTERM the whole group, SIGKILL what is left after ``grace`` s."""
        info: dict[str, Any] = {"sigkill": False}
        if self.proc.poll() is None or group_alive(self.pgid):
            kill_group(self.pgid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                if self.proc.returncode is not None and not group_alive(self.pgid):
                    break
                time.sleep(0.05)
            else:
                info["sigkill"] = True
                kill_group(self.pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            pass
        # Group members orphaned by the leader are reaped by init; wait briefly.
        deadline = time.monotonic() + 5
        while group_alive(self.pgid) and time.monotonic() < deadline:
            kill_group(self.pgid, signal.SIGKILL)
            time.sleep(0.05)
        info["returncode"] = self.proc.returncode
        self._log.close()
        return info
