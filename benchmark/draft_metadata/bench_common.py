"""What the draft-metadata benchmarks share: the checkout they measure, the
children they start (one per Python or SGLang site), their figures and
their Markdown tables.

Each script imports it as ``sglang_dspark_dp_bench.draft_metadata.bench_common``
when the benchmarks are installed, else from beside itself (a script run
from a checkout, as on the GPU machine). Standard library only, so that a
child that times its own imports is not charged for it.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        import sglang

        return str(getattr(sglang, "__version__", "unknown"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def sleep_cycles_per_ms(torch: Any, cycles: int) -> float:
    """GPU cycles of ``torch.cuda._sleep`` per millisecond, from CUDA events
    around one sleep of ``cycles``."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def child_env(
    site: str | None = None, drop: Iterable[str] = ("SGLANG_PLUGINS",)
) -> dict[str, str]:
    """A child's environment: this one without ``drop``, with ``site`` (an
    SGLang install's site-packages) and the checkout's plugin first on
    ``PYTHONPATH``."""
    env = dict(os.environ)
    for name in drop:
        env.pop(name, None)
    parts = [site] if site else []
    parts.append(str(REPO_ROOT / "python"))
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def parse_pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values or []:
        label, sep, path = v.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"{flag} expects LABEL=PATH, got {v!r}")
        out.append((label, path))
    return out


def compare_targets(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """``compare``'s children, ``(label, python, site)``: one per ``--python
    LABEL=PYTHON`` and per ``--site LABEL=SITE`` (this Python), else this
    Python's own SGLang."""
    targets = [(label, py, None) for label, py in parse_pairs(args.python, "--python")]
    targets += [
        (label, sys.executable, site)
        for label, site in parse_pairs(args.site, "--site")
    ]
    if not targets:
        targets = [("installed", sys.executable, None)]
    return targets


def table_lines(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table: the header, the rule, a line per row."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]

    def line(cells: Sequence[Any]) -> str:
        pairs = zip(cells, widths, strict=True)
        return "| " + " | ".join(str(c).ljust(w) for c, w in pairs) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return [line(head), sep, *(line(r) for r in rows)]


def free_port() -> int:
    """A loopback port nothing listens on now (a gloo world's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(fn: Any, rank: int, world: int, port: int, shared: dict, out: Any):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        out.put((rank, fn(rank, world, port, shared)))
    except Exception:
        out.put((rank, {"error": traceback.format_exc()[-2000:]}))


def run_ranks(
    fn: Any, world: int, shared: dict, timeout: float
) -> dict[int, dict[str, Any]]:
    """``fn(rank, world, port, shared)`` in one forked process per rank (a
    gloo world meets at ``port``); each rank's report. Exits naming the
    ranks that failed or sent nothing within ``timeout`` seconds."""
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(fn, r, world, port, shared, results))
        for r in range(world)
    ]
    reports: dict[int, dict[str, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        for p in procs:
            p.start()
        while len(reports) < world and time.monotonic() < deadline:
            try:
                rank, report = results.get(timeout=0.5)
            except queue.Empty:
                if all(p.exitcode is not None for p in procs):
                    break
                continue
            reports[rank] = report
    finally:
        for p in procs:
            p.join(timeout=5)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        results.close()
    errors = {r: rep["error"] for r, rep in reports.items() if "error" in rep}
    missing = [r for r in range(world) if r not in reports]
    if errors or missing:
        raise SystemExit(
            f"{world} ranks: failed (errors: {errors}; no report from: {missing})"
        )
    return reports


def join_gloo(rank: int, world: int, port: int, timeout_s: float) -> Any:
    """This rank of a gloo world over loopback at ``port`` (one torch
    thread, every collective bounded by ``timeout_s``); a group of all its
    ranks with that timeout."""
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timeout,
    )
    return dist.new_group(list(range(world)), timeout=timeout)


# --------------------------------------------------------------------------
# The consensus watch's per-step calls (bench_watch, bench_overlap's watch).
# --------------------------------------------------------------------------


class WatchGroup:
    """What the watch reads of a group coordinator: its CPU process group
    and its size."""

    def __init__(self, pg: Any, world: int) -> None:
        self.cpu_group = pg
        self.world_size = world


class _Runner:
    def __init__(self, group: WatchGroup) -> None:
        self.tp_group = group


class EntryWorker:
    """What the worker-entry site's hook reads of a DSpark worker: its
    draft runner's group and the step bodies it marks as reached."""

    _hosts_draft = True

    def __init__(self, group: WatchGroup) -> None:
        self.draft_model_runner = _Runner(group)

    def _forward_decode(self, batch: Any) -> Any:
        return batch

    def _forward_prefill(self, batch: Any) -> Any:
        return batch


def entry_body(worker: EntryWorker, batch: Any) -> Any:
    """A decode step's call as the hook hands it on: into the body."""
    return worker._forward_decode(batch)


def site_hook(name: str) -> Any:
    """The AROUND hook the watch builds for its site ``name`` on the
    installed SGLang (``sglang_dspark_dp.watch_sites``)."""
    from sglang_dspark_dp import watch_sites

    (site,) = [s for s in watch_sites.SITES if s.name == name]
    return site.build()[3]


def note_verify_step(channel: Any, i: int) -> None:
    """The compact-verify site's calls of one decode step (its planner is
    not run here): the step, then its budget, broadcast entry and tier."""
    from sglang_dspark_dp import watch

    step = channel.next_step("compact-verify budget")
    changes = ("verify-budget-broadcast",)
    channel.note(watch.Event("budget", step, 64, "budget=64", changes))
    channel.note(watch.Event("entry", step, True, "entered", changes))
    channel.note(watch.Event("tier", step, 48 + i % 3, "tier", changes))
