"""Measure one server configuration: GSM8K accuracy, bench_serving, acceptance.

:func:`run_one` starts the configuration's server (through :mod:`.supervision`),
runs the GSM8K client in-process, one ``sglang.bench_serving`` subprocess per
concurrency, reads the speculative acceptance length, stops the server and
records everything in ``<out>/<name>/result.json``. :func:`plan` lists the same
commands without running anything (``--dry-run``).
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
from pathlib import Path
from typing import Any

from . import client as gsm8k_client
from .config import MatrixConfig, ServerConfig
from .reporting import RESULT_FILE, finite, write_json
from .supervision import (
    Server,
    ServerFailed,
    http_get,
    kill_group,
    log_tail,
    port_in_use,
)

_METRIC_RE = re.compile(
    r"^sglang:spec_accept_length(?:\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)\s*$",
    re.MULTILINE,
)


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


def accept_length_from_server(base_url: str) -> tuple[float | None, str | None]:
    """Speculative acceptance length from /server_info, else /metrics."""
    for path in ("/server_info", "/get_server_info"):
        try:
            _, body = http_get(f"{base_url}{path}", timeout=30.0)
            info = json.loads(body)
        except (urllib.error.URLError, OSError, ValueError):
            continue
        if isinstance(info, dict) and isinstance(info.get("decode"), list):
            info = info["decode"][0] if info["decode"] else {}
        states = info.get("internal_states") if isinstance(info, dict) else None
        if isinstance(states, list):
            values = [
                finite(s.get("avg_spec_accept_length"))
                for s in states
                if isinstance(s, dict)
            ]
            values = [v for v in values if v is not None and v > 0]
            if values:
                return sum(values) / len(values), f"{path} avg_spec_accept_length"
        break
    try:
        _, text = http_get(f"{base_url}/metrics", timeout=30.0)
    except (urllib.error.URLError, OSError, ValueError):
        return None, None
    values = []
    for m in _METRIC_RE.finditer(text):
        v = finite(float(m.group(1)))
        if v is not None and v > 0:
            values.append(v)
    if values:
        return sum(values) / len(values), "/metrics sglang:spec_accept_length"
    return None, None


def run_bench_case(
    cfg: MatrixConfig, out_dir: Path, concurrency: int, num_prompts: int
) -> dict[str, Any]:
    """One bench_serving run at ``concurrency``; the case's record."""
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
                kill_group(proc.pid, signal.SIGKILL)
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
        value = finite(result.get("accept_length"))
        if value is not None and value > 0:
            case["accept_length"] = value
            case["accept_length_source"] = "bench_serving accept_length"
    if case["accept_length"] is None:
        value, source = accept_length_from_server(cfg.base_url)
        case["accept_length"], case["accept_length_source"] = value, source
    return case


def _measure(cfg: MatrixConfig, sc: ServerConfig, server: Server, out_dir: Path,
             result: dict[str, Any]) -> None:  # fmt: skip
    """GSM8K, then the bench cases, into ``result`` (the server is healthy)."""
    base_url = cfg.base_url
    result["server_info"], result["server_info_error"] = gsm8k_client.fetch_server_info(
        base_url, 30.0
    )
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
        for c, n in zip(cfg.bench.concurrencies, cfg.bench.num_prompts, strict=False):
            code = server.exited()
            if code is not None:
                raise ServerFailed(
                    f"server exited with code {code} during the benchmarks"
                )
            print(f"[{sc.name}] bench_serving c={c} n={n}", file=sys.stderr)
            result["bench"].append(run_bench_case(cfg, out_dir, c, n))
        lengths = [b["accept_length"] for b in result["bench"] if b["accept_length"]]
        if lengths:
            result["accept_length"] = sum(lengths) / len(lengths)
    if result["accept_length"] is None and result["gsm8k"]:
        result["accept_length"] = result["gsm8k"].get("accept_length")


def run_one(cfg: MatrixConfig, sc: ServerConfig, order: int, out_root: Path) -> dict:
    """Start, measure and stop one configuration; write and return its result.

    Failures are recorded in the result (``status: failed``); KeyboardInterrupt
    is re-raised after the server is stopped and the result written.
    """
    out_dir = out_root / sc.name
    out_dir.mkdir(parents=True, exist_ok=True)
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
        result["startup_s"] = server.wait_healthy(cfg.base_url, cfg.health_timeout_s)
        print(f"[{sc.name}] healthy after {result['startup_s']:.1f} s", file=sys.stderr)
        _measure(cfg, sc, server, out_dir, result)
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
        write_json(out_dir / RESULT_FILE, result)
        print(f"[{sc.name}] {result['status']}"
              + (f": {result['error']}" if result["error"] else ""),
              file=sys.stderr)  # fmt: skip
    return result


def plan(cfg: MatrixConfig, out_root: Path) -> str:
    """The commands :func:`run_one` would run for every configuration."""
    lines: list[str] = []
    for sc in cfg.configs:
        out_dir = out_root / sc.name
        lines.append(f"# {sc.name}")
        env = {**cfg.env, **sc.env}
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        lines.append(
            f"server: {(prefix + ' ') if prefix else ''}{shlex.join(sc.command)}"
        )
        if cfg.gsm8k.enabled:
            argv = gsm8k_argv(cfg, out_dir / "gsm8k.json")
            lines.append(f"gsm8k:  sglang-dspark-dp-gsm8k {shlex.join(argv)}")
        if cfg.bench.enabled:
            for c, n in zip(
                cfg.bench.concurrencies, cfg.bench.num_prompts, strict=False
            ):
                cmd = bench_command(cfg, c, n, out_dir / f"bench_c{c}.jsonl")
                lines.append(f"bench:  {shlex.join(cmd)}")
        lines.append("")
    return "\n".join(lines)
