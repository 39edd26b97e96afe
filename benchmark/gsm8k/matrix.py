"""DSpark x DP validation matrix: launch, measure and compare server configs.

For every ``[[config]]`` of a TOML file this starts the SGLang server, waits for
``/health``, runs the GSM8K client in-process, runs ``sglang.bench_serving``
(as a subprocess, one case per concurrency), reads the speculative acceptance
length, stops the server (whole process group) and writes the raw results into
``<output-dir>/<name>/``. ``report`` then turns the recorded files into a
markdown table and a PNG plot.

    sglang-dspark-dp-matrix run --config matrix.toml --output-dir results/
    sglang-dspark-dp-matrix run --config matrix.toml --output-dir results/ --dry-run
    sglang-dspark-dp-matrix report --results-dir results/
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: python benchmark/gsm8k/matrix.py
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import client as gsm8k_client  # type: ignore[no-redef]
else:
    from . import client as gsm8k_client

try:
    import tomllib  # Python >= 3.11
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ModuleNotFoundError:
        tomllib = None  # type: ignore[assignment]

PROG = "sglang-dspark-dp-matrix"
RESULT_FILE = "result.json"
MATRIX_FILE = "matrix.json"
REPORT_MD = "report.md"
REPORT_PNG = "report.png"
LOG_TAIL_LINES = 60

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_METRIC_RE = re.compile(
    r"^sglang:spec_accept_length(?:\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)\s*$",
    re.MULTILINE,
)


# --------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------


class ConfigError(Exception):
    """The TOML config is invalid; the message names the file and field."""


@dataclass
class Gsm8kSettings:
    enabled: bool = True
    api: str = "generate"
    num_questions: int | None = None
    parallel: int = 64
    num_shots: int = 5
    max_new_tokens: int = 512
    timeout: float = 600.0
    data_path: str | None = None


@dataclass
class BenchSettings:
    enabled: bool = True
    cmd: list[str] = field(
        default_factory=lambda: [sys.executable, "-m", "sglang.bench_serving"]
    )
    dataset_name: str = "random"
    random_input_len: int = 8192
    random_output_len: int = 1024
    random_range_ratio: float | None = None
    concurrencies: list[int] = field(default_factory=lambda: [64, 256])
    num_prompts: list[int] = field(default_factory=lambda: [256, 1024])
    warmup_requests: int = 8
    flush_cache: bool = True
    timeout_s: float = 7200.0
    extra_args: list[str] = field(default_factory=list)


@dataclass
class ServerConfig:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class MatrixConfig:
    path: str
    host: str = "127.0.0.1"
    port: int = 30000
    health_timeout_s: float = 1800.0
    stop_grace_s: float = 30.0
    env: dict[str, str] = field(default_factory=dict)
    gsm8k: Gsm8kSettings = field(default_factory=Gsm8kSettings)
    bench: BenchSettings = field(default_factory=BenchSettings)
    configs: list[ServerConfig] = field(default_factory=list)


class _Fields:
    """Typed access to one TOML table; errors name ``where.key``."""

    def __init__(self, path: str, where: str, table: Any):
        self.path = path
        self.where = where
        if not isinstance(table, dict):
            self.fail(where, "must be a table")
        self.table = table

    def fail(self, key: str, problem: str) -> None:
        raise ConfigError(f"{self.path}: field '{key}' {problem}")

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def get(self, name: str, kind: str, default: Any) -> Any:
        if name not in self.table:
            return default
        value = self.table[name]
        full = self.key(name)
        if kind == "str":
            if not isinstance(value, str) or not value:
                self.fail(full, f"must be a non-empty string, got {value!r}")
        elif kind == "bool":
            if not isinstance(value, bool):
                self.fail(full, f"must be true or false, got {value!r}")
        elif kind in ("int", "pos_int", "nonneg_int"):
            if isinstance(value, bool) or not isinstance(value, int):
                self.fail(full, f"must be an integer, got {value!r}")
            if kind == "pos_int" and value <= 0:
                self.fail(full, f"must be >= 1, got {value}")
            if kind == "nonneg_int" and value < 0:
                self.fail(full, f"must be >= 0, got {value}")
        elif kind in ("number", "pos_number"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                self.fail(full, f"must be a number, got {value!r}")
            if kind == "pos_number" and not value > 0:
                self.fail(full, f"must be > 0, got {value}")
            value = float(value)
        elif kind == "cmd":
            if isinstance(value, str):
                value = shlex.split(value)
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) for v in value)
            ):
                self.fail(full, "must be a non-empty command (string or list)")
        elif kind == "str_list":
            if not isinstance(value, list) or not all(
                isinstance(v, str) for v in value
            ):
                self.fail(full, f"must be a list of strings, got {value!r}")
        elif kind == "pos_int_list":
            if (
                not isinstance(value, list)
                or not value
                or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v > 0
                    for v in value
                )
            ):
                self.fail(
                    full, f"must be a non-empty list of integers >= 1, got {value!r}"
                )
        elif kind == "env":
            if not isinstance(value, dict):
                self.fail(full, "must be a table of strings")
            out = {}
            for k, v in value.items():
                if isinstance(v, bool) or not isinstance(v, str | int | float):
                    self.fail(f"{full}.{k}", f"must be a string, got {v!r}")
                out[str(k)] = str(v)
            value = out
        return value


_SETTINGS_KEYS = {
    "host", "port", "health_timeout_s", "stop_grace_s", "env", "server_cmd",
    "common_args", "gsm8k", "bench_serving", "bench_serving_cmd",
}  # fmt: skip
_GSM8K_KEYS = {
    "enabled", "api", "num_questions", "parallel", "num_shots", "max_new_tokens",
    "timeout", "data_path",
}  # fmt: skip
_BENCH_KEYS = {
    "enabled", "dataset_name", "random_input_len", "random_output_len",
    "random_range_ratio", "concurrencies", "num_prompts", "warmup_requests",
    "flush_cache", "timeout_s", "extra_args",
}  # fmt: skip
_CONFIG_KEYS = {"name", "command", "args", "env"}


def _check_unknown(path: str, where: str, table: dict, allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            full = f"{where}.{key}" if where else key
            raise ConfigError(
                f"{path}: unknown field '{full}' (expected one of: "
                f"{', '.join(sorted(allowed))})"
            )


def parse_config(data: dict[str, Any], path: str = "<config>") -> MatrixConfig:
    """Validate a decoded TOML document into a :class:`MatrixConfig`."""
    _check_unknown(path, "", data, {"settings", "config"})
    cfg = MatrixConfig(path=path)
    st = _Fields(path, "settings", data.get("settings", {}))
    _check_unknown(path, "settings", st.table, _SETTINGS_KEYS)
    cfg.host = st.get("host", "str", cfg.host)
    cfg.port = st.get("port", "pos_int", cfg.port)
    if cfg.port > 65535:
        st.fail("settings.port", f"must be <= 65535, got {cfg.port}")
    cfg.health_timeout_s = st.get("health_timeout_s", "pos_number", 1800.0)
    cfg.stop_grace_s = st.get("stop_grace_s", "pos_number", 30.0)
    cfg.env = st.get("env", "env", {})
    server_cmd = st.get("server_cmd", "cmd", ["sglang", "serve"])
    common_args = st.get("common_args", "str_list", [])

    g = _Fields(path, "settings.gsm8k", st.table.get("gsm8k", {}))
    _check_unknown(path, "settings.gsm8k", g.table, _GSM8K_KEYS)
    gs = cfg.gsm8k
    gs.enabled = g.get("enabled", "bool", True)
    gs.api = g.get("api", "str", "generate")
    if gs.api not in ("generate", "openai"):
        g.fail("settings.gsm8k.api", f"must be 'generate' or 'openai', got {gs.api!r}")
    gs.num_questions = g.get("num_questions", "pos_int", None)
    gs.parallel = g.get("parallel", "pos_int", gs.parallel)
    gs.num_shots = g.get("num_shots", "nonneg_int", gs.num_shots)
    gs.max_new_tokens = g.get("max_new_tokens", "pos_int", gs.max_new_tokens)
    gs.timeout = g.get("timeout", "pos_number", gs.timeout)
    gs.data_path = g.get("data_path", "str", None)
    if gs.data_path is not None and not os.path.isabs(gs.data_path):
        gs.data_path = str((Path(path).parent / gs.data_path).resolve())

    b = _Fields(path, "settings.bench_serving", st.table.get("bench_serving", {}))
    _check_unknown(path, "settings.bench_serving", b.table, _BENCH_KEYS)
    bs = cfg.bench
    bs.cmd = st.get("bench_serving_cmd", "cmd", bs.cmd)
    bs.enabled = b.get("enabled", "bool", True)
    bs.dataset_name = b.get("dataset_name", "str", bs.dataset_name)
    bs.random_input_len = b.get("random_input_len", "pos_int", bs.random_input_len)
    bs.random_output_len = b.get("random_output_len", "pos_int", bs.random_output_len)
    bs.random_range_ratio = b.get("random_range_ratio", "number", None)
    bs.concurrencies = b.get("concurrencies", "pos_int_list", bs.concurrencies)
    prompts = b.table.get("num_prompts", None)
    if prompts is None:
        bs.num_prompts = [4 * c for c in bs.concurrencies]
    elif isinstance(prompts, int) and not isinstance(prompts, bool):
        bs.num_prompts = [b.get("num_prompts", "pos_int", 1)] * len(bs.concurrencies)
    else:
        bs.num_prompts = b.get("num_prompts", "pos_int_list", [])
        if len(bs.num_prompts) != len(bs.concurrencies):
            b.fail(
                "settings.bench_serving.num_prompts",
                f"must have one entry per concurrency ({len(bs.concurrencies)}), "
                f"got {len(bs.num_prompts)}",
            )
    if len(set(bs.concurrencies)) != len(bs.concurrencies):
        b.fail("settings.bench_serving.concurrencies", "has duplicate values")
    bs.warmup_requests = b.get("warmup_requests", "nonneg_int", bs.warmup_requests)
    bs.flush_cache = b.get("flush_cache", "bool", True)
    bs.timeout_s = b.get("timeout_s", "pos_number", bs.timeout_s)
    bs.extra_args = b.get("extra_args", "str_list", [])

    entries = data.get("config")
    if entries is None:
        raise ConfigError(f"{path}: field 'config' is missing (add [[config]] tables)")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: field 'config' must be a non-empty [[config]] list")
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"config[{i}]"
        c = _Fields(path, where, entry)
        _check_unknown(path, where, entry, _CONFIG_KEYS)
        if "name" not in entry:
            c.fail(f"{where}.name", "is missing")
        name = c.get("name", "str", "")
        if not _NAME_RE.match(name):
            c.fail(f"{where}.name", f"must match {_NAME_RE.pattern}, got {name!r}")
        if name in seen:
            c.fail(f"{where}.name", f"duplicates an earlier name {name!r}")
        seen.add(name)
        if "command" in entry and "args" in entry:
            c.fail(f"{where}.command", "cannot be combined with 'args'")
        if "command" in entry:
            command = list(c.get("command", "cmd", []))
        elif "args" in entry:
            command = server_cmd + common_args + list(c.get("args", "str_list", []))
        else:
            c.fail(f"{where}.command", "is missing (give 'command' or 'args')")
        command = [a.replace("{host}", cfg.host).replace("{port}", str(cfg.port))
                   for a in command]  # fmt: skip
        if "--port" not in command:
            command += ["--host", cfg.host, "--port", str(cfg.port)]
        cfg.configs.append(
            ServerConfig(name=name, command=command, env=c.get("env", "env", {}))
        )
    return cfg


def load_config(path: str | os.PathLike) -> MatrixConfig:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    if tomllib is None:
        raise ConfigError("reading TOML needs Python >= 3.11 or the 'tomli' package")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    return parse_config(data, str(p))


# --------------------------------------------------------------------------
# Server process handling
# --------------------------------------------------------------------------


def _http(url: str, timeout: float, data: bytes | None = None) -> tuple[int, str]:
    req = urllib.request.Request(url, data=data, method="POST" if data else "GET")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
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


class ServerFailed(Exception):
    pass


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

    def wait_healthy(self, base_url: str, timeout: float) -> float:
        started = time.monotonic()
        deadline = started + timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerFailed(
                    f"server exited with code {code} before /health answered"
                )
            try:
                status, _ = _http(f"{base_url}/health", timeout=5.0)
                if status == 200:
                    return time.monotonic() - started
            except (urllib.error.URLError, OSError, ValueError):
                pass
            if time.monotonic() >= deadline:
                raise ServerFailed(
                    f"server did not answer {base_url}/health within {timeout:g} s"
                )
            time.sleep(0.2 if timeout < 30 else 2.0)

    def _group_alive(self) -> bool:
        return group_alive(self.pgid)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float) -> dict[str, Any]:
        """SIGTERM the whole group, SIGKILL what is left after ``grace`` s."""
        info: dict[str, Any] = {"sigkill": False}
        if self.proc.poll() is None or self._group_alive():
            self._signal_group(signal.SIGTERM)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline:
                self.proc.poll()
                if self.proc.returncode is not None and not self._group_alive():
                    break
                time.sleep(0.05)
            else:
                info["sigkill"] = True
                self._signal_group(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - unkillable
            pass
        # Group members orphaned by the leader are reaped by init; wait briefly.
        deadline = time.monotonic() + 5
        while self._group_alive() and time.monotonic() < deadline:
            self._signal_group(signal.SIGKILL)
            time.sleep(0.05)
        info["returncode"] = self.proc.returncode
        self._log.close()
        return info


# --------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------


def bench_command(
    cfg: MatrixConfig, concurrency: int, num_prompts: int, output_file: Path
) -> list[str]:
    bs = cfg.bench
    cmd = list(bs.cmd) + [
        "--backend", "sglang",
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--dataset-name", bs.dataset_name,
        "--random-input-len", str(bs.random_input_len),
        "--random-output-len", str(bs.random_output_len),
        "--max-concurrency", str(concurrency),
        "--num-prompts", str(num_prompts),
        "--warmup-requests", str(bs.warmup_requests),
        "--output-file", str(output_file),
    ]  # fmt: skip
    if bs.random_range_ratio is not None:
        cmd += ["--random-range-ratio", repr(bs.random_range_ratio)]
    if bs.flush_cache:
        cmd.append("--flush-cache")
    return cmd + list(bs.extra_args)


def gsm8k_argv(cfg: MatrixConfig, result_file: Path) -> list[str]:
    g = cfg.gsm8k
    argv = [
        "--api", g.api,
        "--host", cfg.host,
        "--port", str(cfg.port),
        "--parallel", str(g.parallel),
        "--num-shots", str(g.num_shots),
        "--max-new-tokens", str(g.max_new_tokens),
        "--timeout", repr(g.timeout),
        "--result-file", str(result_file),
        "--no-progress",
    ]  # fmt: skip
    if g.num_questions is not None:
        argv += ["--num-questions", str(g.num_questions)]
    if g.data_path is not None:
        argv += ["--data-path", g.data_path]
    return argv


def read_last_jsonl(path: Path) -> dict[str, Any] | None:
    try:
        lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    except OSError:
        return None
    for line in reversed(lines):
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def accept_length_from_server(base_url: str) -> tuple[float | None, str | None]:
    """Speculative acceptance length from /server_info, else /metrics."""
    for path in ("/server_info", "/get_server_info"):
        try:
            _, body = _http(f"{base_url}{path}", timeout=30.0)
            info = json.loads(body)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("decode"), list):
            info = info["decode"][0] if info["decode"] else {}
        states = info.get("internal_states") if isinstance(info, dict) else None
        if isinstance(states, list):
            values = [
                _finite(s.get("avg_spec_accept_length"))
                for s in states
                if isinstance(s, dict)
            ]
            values = [v for v in values if v is not None and v > 0]
            if values:
                return sum(values) / len(values), f"{path} avg_spec_accept_length"
        break
    try:
        _, text = _http(f"{base_url}/metrics", timeout=30.0)
    except (urllib.error.URLError, OSError, ValueError):
        return None, None
    values = []
    for m in _METRIC_RE.finditer(text):
        v = _finite(float(m.group(1)))
        if v is not None and v > 0:
            values.append(v)
    if values:
        return sum(values) / len(values), "/metrics sglang:spec_accept_length"
    return None, None


def run_bench_case(
    cfg: MatrixConfig, out_dir: Path, concurrency: int, num_prompts: int
) -> dict[str, Any]:
    output_file = out_dir / f"bench_c{concurrency}.jsonl"
    log_path = out_dir / f"bench_c{concurrency}.log"
    output_file.unlink(missing_ok=True)  # bench_serving appends
    cmd = bench_command(cfg, concurrency, num_prompts, output_file)
    case: dict[str, Any] = {
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "command": cmd,
        "output_file": output_file.name,
        "status": "failed",
        "error": None,
        "result": None,
        "accept_length": None,
        "accept_length_source": None,
    }
    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=cfg.bench.timeout_s)
        except subprocess.TimeoutExpired:
            case["error"] = f"bench_serving timed out after {cfg.bench.timeout_s:g} s"
        finally:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    case["elapsed_s"] = time.monotonic() - started
    case["returncode"] = proc.returncode
    result = read_last_jsonl(output_file)
    if case["error"] is None:
        if proc.returncode != 0:
            case["error"] = f"bench_serving exited with code {proc.returncode}"
        elif result is None:
            case["error"] = f"bench_serving wrote no result to {output_file.name}"
        else:
            case["status"] = "ok"
    if case["error"] is not None:
        case["log_tail"] = log_tail(log_path)
    if result is not None:
        result.pop("server_info", None)  # large; kept once per config instead
        case["result"] = result
        value = _finite(result.get("accept_length"))
        if value is not None and value > 0:
            case["accept_length"] = value
            case["accept_length_source"] = "bench_serving accept_length"
    if case["accept_length"] is None:
        base_url = f"http://{cfg.host}:{cfg.port}"
        value, source = accept_length_from_server(base_url)
        case["accept_length"], case["accept_length_source"] = value, source
    return case


def _server_info(base_url: str) -> tuple[Any, str | None]:
    return gsm8k_client.fetch_server_info(base_url, 30.0)


def run_one(cfg: MatrixConfig, sc: ServerConfig, order: int, out_root: Path) -> dict:
    out_dir = out_root / sc.name
    out_dir.mkdir(parents=True, exist_ok=True)
    base_url = f"http://{cfg.host}:{cfg.port}"
    log_path = out_dir / "server.log"
    result: dict[str, Any] = {
        "name": sc.name,
        "order": order,
        "command": sc.command,
        "status": "running",
        "error": None,
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": {
            "host": cfg.host,
            "port": cfg.port,
            "concurrencies": cfg.bench.concurrencies,
            "num_prompts": cfg.bench.num_prompts,
            "random_input_len": cfg.bench.random_input_len,
            "random_output_len": cfg.bench.random_output_len,
            "warmup_requests": cfg.bench.warmup_requests,
            "gsm8k": vars(cfg.gsm8k),
        },
        "gsm8k": None,
        "bench": [],
        "accept_length": None,
    }
    server: Server | None = None
    print(f"[{sc.name}] starting: {shlex.join(sc.command)}", file=sys.stderr)
    try:
        if port_in_use(cfg.host, cfg.port):
            raise ServerFailed(
                f"{cfg.host}:{cfg.port} is already in use; refusing to measure "
                "a server this run did not start"
            )
        server = Server(sc.command, {**cfg.env, **sc.env}, log_path)
        result["pid"] = server.proc.pid
        result["startup_s"] = server.wait_healthy(base_url, cfg.health_timeout_s)
        print(f"[{sc.name}] healthy after {result['startup_s']:.1f} s", file=sys.stderr)
        result["server_info"], result["server_info_error"] = _server_info(base_url)

        if cfg.gsm8k.enabled:
            gsm_file = out_dir / "gsm8k.json"
            args = gsm8k_client.parse_args(gsm8k_argv(cfg, gsm_file))
            gsm = gsm8k_client.run(args)
            result["gsm8k"] = {"result_file": gsm_file.name, **gsm["summary"]}
            value, source = accept_length_from_server(base_url)
            result["gsm8k"]["accept_length"] = value
            result["gsm8k"]["accept_length_source"] = source
            print(f"[{sc.name}] gsm8k\n{gsm8k_client.format_summary(gsm['summary'])}",
                  file=sys.stderr)  # fmt: skip

        if cfg.bench.enabled:
            for c, n in zip(
                cfg.bench.concurrencies, cfg.bench.num_prompts, strict=False
            ):
                if server.proc.poll() is not None:
                    raise ServerFailed(
                        f"server exited with code {server.proc.returncode} "
                        "during the benchmarks"
                    )
                print(f"[{sc.name}] bench_serving c={c} n={n}", file=sys.stderr)
                result["bench"].append(run_bench_case(cfg, out_dir, c, n))
            lengths = [
                b["accept_length"] for b in result["bench"] if b["accept_length"]
            ]
            if lengths:
                result["accept_length"] = sum(lengths) / len(lengths)
        if result["accept_length"] is None and result["gsm8k"]:
            result["accept_length"] = result["gsm8k"].get("accept_length")
        failed = [b for b in result["bench"] if b["status"] != "ok"]
        if failed:
            result["status"] = "failed"
            result["error"] = "; ".join(
                f"c{b['concurrency']}: {b['error']}" for b in failed
            )
        else:
            result["status"] = "ok"
    except KeyboardInterrupt:
        result["status"] = "interrupted"
        result["error"] = "interrupted"
        raise
    except gsm8k_client.Interrupted:
        result["status"] = "interrupted"
        result["error"] = "interrupted during gsm8k"
        raise KeyboardInterrupt from None
    except (
        ServerFailed,
        gsm8k_client.DataError,
        gsm8k_client.ServerUnreachable,
        OSError,
    ) as exc:
        result["status"] = "failed"
        result["error"] = str(exc)
    except SystemExit as exc:  # a client usage error (argparse)
        result["status"] = "failed"
        result["error"] = f"gsm8k client rejected its arguments (exit {exc.code})"
    finally:
        if server is not None:
            result["stop"] = server.stop(cfg.stop_grace_s)
            if result["status"] != "ok":
                result["log_tail"] = log_tail(log_path)
        result["finished_at"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        gsm8k_client.write_result(out_dir / RESULT_FILE, result)
        print(f"[{sc.name}] {result['status']}"
              + (f": {result['error']}" if result["error"] else ""),
              file=sys.stderr)  # fmt: skip
    return result


def dry_run(cfg: MatrixConfig, out_root: Path) -> None:
    for sc in cfg.configs:
        out_dir = out_root / sc.name
        print(f"# {sc.name}")
        env = {**cfg.env, **sc.env}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        print(f"server: {(prefix + ' ') if prefix else ''}{shlex.join(sc.command)}")
        if cfg.gsm8k.enabled:
            argv = gsm8k_argv(cfg, out_dir / "gsm8k.json")
            print(f"gsm8k:  sglang-dspark-dp-gsm8k {shlex.join(argv)}")
        if cfg.bench.enabled:
            for c, n in zip(
                cfg.bench.concurrencies, cfg.bench.num_prompts, strict=False
            ):
                cmd = bench_command(cfg, c, n, out_dir / f"bench_c{c}.jsonl")
                print(f"bench:  {shlex.join(cmd)}")
        print()


def cmd_run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(args.config)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.only:
        wanted = set(args.only)
        unknown = wanted - {c.name for c in cfg.configs}
        if unknown:
            print(f"{PROG}: error: argument --only: unknown configuration(s) "
                  f"{', '.join(sorted(unknown))}", file=sys.stderr)  # fmt: skip
            return 2
        cfg.configs = [c for c in cfg.configs if c.name in wanted]
    out_root = Path(args.output_dir)
    if args.dry_run:
        dry_run(cfg, out_root)
        return 0
    out_root.mkdir(parents=True, exist_ok=True)
    index = {
        "config_file": str(Path(args.config).resolve()),
        "configs": [c.name for c in cfg.configs],
        "status": {},
    }
    gsm8k_client.write_result(out_root / MATRIX_FILE, index)

    # Turn SIGTERM into KeyboardInterrupt so the finally blocks stop the servers.
    def _on_term(signum, frame):
        raise KeyboardInterrupt

    previous = None
    try:
        previous = signal.signal(signal.SIGTERM, _on_term)
    except ValueError:  # not the main thread
        previous = None
    code = 0
    try:
        for order, sc in enumerate(cfg.configs):
            res = run_one(cfg, sc, order, out_root)
            index["status"][sc.name] = res["status"]
            gsm8k_client.write_result(out_root / MATRIX_FILE, index)
            if res["status"] != "ok":
                code = 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; servers stopped, partial results kept in "
              f"{out_root}", file=sys.stderr)  # fmt: skip
        code = 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    if code != 130 and not args.no_report:
        write_report(out_root)
    return code


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def load_results(results_dir: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(results_dir.glob(f"*/{RESULT_FILE}")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"{PROG}: skipping unreadable {path}: {exc}", file=sys.stderr)
            continue
        if isinstance(data, dict) and "name" in data:
            found.append(data)
    order = []
    try:
        order = json.loads((results_dir / MATRIX_FILE).read_text()).get("configs", [])
    except (OSError, json.JSONDecodeError, AttributeError):
        pass

    def key(r: dict[str, Any]) -> tuple:
        pos = order.index(r["name"]) if r["name"] in order else len(order)
        return (pos, r.get("order", 0), r["name"])

    return sorted(found, key=key)


def _bench_value(res: dict[str, Any], concurrency: int, name: str) -> float | None:
    for case in res.get("bench") or []:
        if case.get("concurrency") == concurrency and case.get("status") == "ok":
            return _finite((case.get("result") or {}).get(name))
    return None


def report_rows(results: list[dict[str, Any]]) -> tuple[list[str], list[list]]:
    """Column titles and per-config raw values (None = missing)."""
    concurrencies = sorted(
        {
            case["concurrency"]
            for r in results
            for case in r.get("bench") or []
            if isinstance(case.get("concurrency"), int)
        }
    )
    titles = ["GSM8K accuracy", "Invalid"]
    titles += [f"Output tok/s c{c}" for c in concurrencies]
    titles += [f"Median TPOT ms c{c}" for c in concurrencies]
    titles.append("Accept length")
    rows = []
    for r in results:
        g = r.get("gsm8k") or {}
        row = [_finite(g.get("accuracy")), _finite(g.get("invalid"))]
        row += [_bench_value(r, c, "output_throughput") for c in concurrencies]
        row += [_bench_value(r, c, "median_tpot_ms") for c in concurrencies]
        row.append(_finite(r.get("accept_length")))
        rows.append(row)
    return titles, rows


def _digits(title: str) -> int:
    if title in ("GSM8K accuracy", "Invalid"):
        return 3
    if title.startswith("Output tok/s"):
        return 1
    return 2


def format_cell(value: float | None, base: float | None, digits: int) -> str:
    if value is None:
        return "n/a"
    text = f"{value:.{digits}f}"
    if base is not None and base != 0:
        text += f" ({value / base:.2f}x)"
    return text


def render_markdown(results: list[dict[str, Any]]) -> str:
    titles, rows = report_rows(results)
    lines = [
        "# DSpark x DP validation matrix",
        "",
        "Ratios are relative to the first configuration"
        + (f" (`{results[0]['name']}`)." if results else "."),
        "",
        "| Configuration | " + " | ".join(titles) + " |",
        "|---|" + "---:|" * len(titles),
    ]
    base = rows[0] if rows else []
    for r, row in zip(results, rows, strict=False):
        cells = [format_cell(v, base[i], _digits(titles[i])) for i, v in enumerate(row)]
        lines.append(f"| {r['name']} | " + " | ".join(cells) + " |")
    notes = [r for r in results if r.get("status") != "ok"]
    if notes:
        lines += ["", "Failures:", ""]
        for r in notes:
            lines.append(f"- `{r['name']}`: {r.get('status')}: {r.get('error')}")
    return "\n".join(lines) + "\n"


def render_plot(results: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    titles, rows = report_rows(results)
    names = [r["name"] for r in results]
    panels = [i for i, t in enumerate(titles) if t.startswith("Output tok/s")]
    panels.append(titles.index("GSM8K accuracy"))
    fig, axes = plt.subplots(
        1, len(panels), figsize=(4.5 * len(panels), 4.0), squeeze=False
    )
    for ax, col in zip(axes[0], panels, strict=False):
        values = [row[col] if row[col] is not None else 0.0 for row in rows]
        bars = ax.bar(range(len(names)), values, color="tab:blue")
        for bar, row in zip(bars, rows, strict=False):
            label = (
                "n/a" if row[col] is None else f"{row[col]:.{_digits(titles[col])}f}"
            )
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)  # fmt: skip
        ax.set_title(titles[col])
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        if titles[col] == "GSM8K accuracy":
            ax.set_ylim(0, 1.05)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_report(results_dir: Path, output: Path | None = None) -> int:
    results = load_results(results_dir)
    if not results:
        print(f"{PROG}: error: no */{RESULT_FILE} files under {results_dir}",
              file=sys.stderr)  # fmt: skip
        return 2
    md_path = output or results_dir / REPORT_MD
    md_path.write_text(render_markdown(results))
    print(f"Report written to {md_path}")
    png_path = md_path.with_suffix(".png")
    if render_plot(results, png_path):
        print(f"Plot written to {png_path}")
    else:
        print("matplotlib is not installed; plot skipped")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    results_dir = Path(args.results_dir)
    if not results_dir.is_dir():
        print(f"{PROG}: error: results directory not found: {results_dir}",
              file=sys.stderr)  # fmt: skip
        return 2
    return write_report(results_dir, Path(args.output) if args.output else None)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="launch and measure every configuration")
    r.add_argument("--config", required=True, help="TOML matrix config")
    r.add_argument("--output-dir", required=True, help="folder for raw results")
    r.add_argument("--only", nargs="+", metavar="NAME", help="run only these configs")
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="print the commands that would run, launch nothing",
    )
    r.add_argument("--no-report", action="store_true",
                   help="do not write the report after the run")  # fmt: skip
    r.set_defaults(func=cmd_run)
    rep = sub.add_parser("report", help="table + plot from recorded results")
    rep.add_argument("--results-dir", required=True)
    rep.add_argument("--output", default=None,
                     help=f"markdown path (default: RESULTS_DIR/{REPORT_MD}; "
                          "the PNG goes next to it)")  # fmt: skip
    rep.set_defaults(func=cmd_report)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
