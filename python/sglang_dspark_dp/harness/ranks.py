"""One process per simulated rank, each reporting once: the startup and the
compact-verify harnesses run their ranks through here.

:func:`run_ranks` starts ``world`` processes (``fork`` by default, so the
ranks start with SGLang imported; ``SGLANG_DSPARK_DP_START_METHOD`` picks
another), each calling ``body(rank)`` and sending back the report it
returns (or, if it raises, ``failed(rank, traceback)``). A rank that has
reported stays alive (as a rank that moved on would) until the parent has
every report or the deadline passes, so no peer sees a closed connection
instead of a hang; then every process is joined, and killed if it does not
end. A rank that dies without reporting gets ``failed(rank, why)``; one
that never reports by the deadline is left out of the answer (the caller
names it as hung).
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import queue
import time
import traceback
from collections.abc import Callable
from typing import Any

START_METHOD_ENV = "SGLANG_DSPARK_DP_START_METHOD"

Report = dict[str, Any]


def is_int(value: Any) -> bool:
    """An int that is not a bool (a config field check)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite int or float that is not a bool (a config field check)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
    )


def check_groups(cfg: Any, max_world: int, error: type[Exception]) -> None:
    """A config field check: ``cfg.groups`` TP groups of ``cfg.tp`` ranks
    fit in ``max_world`` ranks; else ``error`` saying so."""
    if not is_int(cfg.groups) or not 1 <= cfg.groups <= max_world // cfg.tp:
        raise error(
            f"groups must be an integer between 1 and {max_world // cfg.tp} "
            f"(at most {max_world} ranks in all), got {cfg.groups!r}"
        )


def check_timing(cfg: Any, error: type[Exception]) -> None:
    """A config field check: ``cfg.timeout_s`` and ``cfg.hang_s`` positive
    numbers, ``hang_s`` the shorter, ``cfg.port`` 0-65535; else ``error``
    naming the first that is not."""
    for field in ("timeout_s", "hang_s"):
        value = getattr(cfg, field)
        if not is_number(value) or value <= 0:
            raise error(f"{field} must be a positive number, got {value!r}")
    if cfg.hang_s >= cfg.timeout_s:
        raise error(
            f"hang_s must be less than timeout_s ({cfg.timeout_s}), got "
            f"{cfg.hang_s!r}"
        )
    if not is_int(cfg.port) or not 0 <= cfg.port <= 65535:
        raise error(f"port must be an integer 0-65535, got {cfg.port!r}")


def _rank_main(rank: int, body, failed, results, release, timeout_s: float) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        report = body(rank)
    except Exception as exc:
        report = failed(rank, "".join(traceback.format_exception(exc))[-2000:])
    results.put((rank, report))
    release.wait(timeout_s)
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def run_ranks(
    world: int,
    body: Callable[[int], Report],
    failed: Callable[[int, str], Report],
    *,
    timeout_s: float,
) -> dict[int, Report]:
    """Every rank's report, by rank (a rank missing: no report in time)."""
    ctx = mp.get_context(os.environ.get(START_METHOD_ENV, "fork"))
    results = ctx.Queue()
    release = ctx.Event()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(r, body, failed, results, release, timeout_s),
            daemon=True,
        )
        for r in range(world)
    ]
    deadline = time.monotonic() + timeout_s
    reports: dict[int, Report] = {}
    try:
        for p in procs:
            p.start()
        while len(reports) < world and time.monotonic() < deadline:
            try:
                rank, report = results.get(timeout=0.2)
                reports[rank] = report
                continue
            except queue.Empty:
                pass
            for r, p in enumerate(procs):
                if r not in reports and p.exitcode is not None:
                    # Its report may still be in flight; give it a moment.
                    try:
                        rank, report = results.get(timeout=1.0)
                        reports[rank] = report
                    except queue.Empty:
                        reports[r] = failed(
                            r, f"the rank's process died (exit code {p.exitcode})"
                        )
    finally:
        release.set()
        for p in procs:
            p.join(timeout=5)
        stop(procs, results)
    return reports


def stop(procs: list[Any], results: Any) -> None:
    """Kill the rank processes still alive, join them all, and close the
    queue they reported on."""
    for p in procs:
        if p.is_alive():
            p.kill()
    for p in procs:
        p.join(timeout=5)
    results.close()
