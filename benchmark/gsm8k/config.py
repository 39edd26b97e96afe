"""Parse and validate the matrix TOML file into typed settings.

:func:`load_config` reads the file (``tomllib``), :func:`parse_config` checks
every table and field; bad input raises :class:`ConfigError` whose message
names the file, the field (``settings.gsm8k.parallel``, ``config[2].name``) and
the value that was rejected.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROG = "sglang-dspark-dp-matrix"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


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

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class _Fields:
    """Typed access to one TOML table; errors name ``where.key`` and the value."""

    def __init__(self, path: str, where: str, table: Any):
        self.path = path
        self.where = where
        if not isinstance(table, dict):
            self.fail(where, f"must be a table, got {table!r}")
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
            original = value
            if isinstance(value, str):
                try:
                    value = shlex.split(value)
                except ValueError as exc:
                    self.fail(full, f"is not a valid command ({exc}), got {value!r}")
            if (
                not isinstance(value, list)
                or not value
                or not all(isinstance(v, str) for v in value)
            ):
                self.fail(
                    full,
                    f"must be a non-empty command (string or list of strings), "
                    f"got {original!r}",
                )
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
                self.fail(full, f"must be a table of strings, got {value!r}")
            out = {}
            for k, v in value.items():
                if isinstance(v, bool) or not isinstance(v, str | int | float):
                    self.fail(f"{full}.{k}", f"must be a string, got {v!r}")
                out[str(k)] = str(v)
            value = out
        else:  # pragma: no cover - a programming error
            raise ValueError(f"unknown field kind {kind!r}")
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


def _parse_gsm8k(path: str, st: _Fields, gs: Gsm8kSettings) -> None:
    g = _Fields(path, "settings.gsm8k", st.table.get("gsm8k", {}))
    _check_unknown(path, "settings.gsm8k", g.table, _GSM8K_KEYS)
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


def _parse_bench(path: str, st: _Fields, bs: BenchSettings) -> None:
    b = _Fields(path, "settings.bench_serving", st.table.get("bench_serving", {}))
    _check_unknown(path, "settings.bench_serving", b.table, _BENCH_KEYS)
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
                f"got {len(bs.num_prompts)}: {bs.num_prompts!r}",
            )
    if len(set(bs.concurrencies)) != len(bs.concurrencies):
        b.fail(
            "settings.bench_serving.concurrencies",
            f"has duplicate values, got {bs.concurrencies!r}",
        )
    bs.warmup_requests = b.get("warmup_requests", "nonneg_int", bs.warmup_requests)
    bs.flush_cache = b.get("flush_cache", "bool", True)
    bs.timeout_s = b.get("timeout_s", "pos_number", bs.timeout_s)
    bs.extra_args = b.get("extra_args", "str_list", [])


def _parse_configs(
    path: str,
    cfg: MatrixConfig,
    entries: Any,
    server_cmd: list[str],
    common_args: list[str],
) -> None:
    if entries is None:
        raise ConfigError(f"{path}: field 'config' is missing (add [[config]] tables)")
    if not isinstance(entries, list) or not entries:
        raise ConfigError(
            f"{path}: field 'config' must be a non-empty [[config]] list, "
            f"got {entries!r}"
        )
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
    _parse_gsm8k(path, st, cfg.gsm8k)
    _parse_bench(path, st, cfg.bench)
    _parse_configs(path, cfg, data.get("config"), server_cmd, common_args)
    return cfg


def load_config(path: str | os.PathLike) -> MatrixConfig:
    """Read and validate a matrix TOML file; raise :class:`ConfigError`."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read: {exc}") from exc
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from exc
    return parse_config(data, str(p))
