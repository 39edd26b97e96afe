"""What the consensus watch costs the scheduler thread per decode step, on
CPU gloo ranks.

With ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER=1`` the plugin's watch
(``sglang_dspark_dp.watch``) hands every watched decision to a channel: at a
compact-verify step the scheduler thread counts the step and enqueues three
events (budget, ``verify_lens`` broadcast entry, graph tier); a thread of
the watch's own drains them in lock-step over a gloo group of its own. The
scheduler thread never waits, but the thread takes the GIL while it hashes
and compares, so the cost is measured where it lands: on a stand-in step.

One process per rank joined by gloo over loopback. Each step is
``--work-us`` microseconds of pure-Python work on the scheduler thread (a
DSpark decode step's host time is milliseconds), plus, with the watch on,
the same calls the verify site makes (``next_step``, three ``Event``s,
three ``note``s) on the watch's real channel; with ``--draft``, also the
draft-batch site's of a DP-attention step (``next_step``, the DP sync
sizes of every rank and the graph admission: two more ``Event``s and
``note``s); with ``--entry``, also the worker-entry site's real hook
(``sglang_dspark_dp.watch_sites``, built on the installed
``DSparkWorkerV2``) around a stand-in step body, which off is called
directly. Off and on alternate for
``--rounds`` rounds; each round times ``--steps`` steps. The channel is
made once per run, as a server makes one per group, so its thread idles
through the off rounds (a wake-up every 10 ms). Per rank count:

* host µs added per step: the median step on minus the median step off,
  of the slowest rank, per round;
* steps/s on over off: total time off over total time on, slowest rank.

The goal (issue 36): at most 20 µs per step and 1 % of steps/s. These
machines are noisy: every round is printed; one round is not a result.

Usage::

    python benchmark/draft_metadata/bench_watch.py --ranks 2 4 8 --rounds 3
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import time
from typing import Any

try:  # installed: sglang-dspark-dp-bench
    from sglang_dspark_dp_bench.draft_metadata import bench_common as common
except ImportError:  # run as a script beside bench_common.py
    import bench_common as common

GOAL_US = 20.0
GOAL_RATIO = 0.99


def _work(us: float) -> None:
    """``us`` microseconds of pure-Python work (holds the GIL, as the
    scheduler's own Python does)."""
    end = time.perf_counter_ns() + int(us * 1000)
    n = 0
    while time.perf_counter_ns() < end:
        n += 1


def _steps(
    steps: int,
    work_us: float,
    channel: Any,
    *,
    draft: bool = False,
    entry: tuple[Any, common.EntryWorker] | None = None,
) -> list[float]:
    from sglang_dspark_dp import watch

    out = []
    world = channel.pg.size() if channel is not None and draft else 0
    for i in range(steps):
        t0 = time.perf_counter_ns()
        _work(work_us)
        if entry is not None:
            hook, worker = entry
            if channel is not None:
                hook(common.entry_body, worker, i)
            else:
                common.entry_body(worker, i)
        if channel is not None:
            common.note_verify_step(channel, i)
            if draft:
                dstep = channel.next_step("draft DP sync sizes")
                raw = tuple(4 + (i + r) % 5 for r in range(world))
                scaled = tuple(4 * n for n in raw)

                def shown(scaled=scaled, raw=raw) -> str:  # lazy, as the site's
                    return (
                        f"sizes={list(scaled)} for logprobs={list(scaled)}"
                        f" (per-rank counts {list(raw)})"
                    )

                key = (scaled, scaled, raw)
                dp = ("dp-draft-metadata",)
                channel.note(watch.Event("sizes", dstep, key, shown, dp))
                channel.note(watch.Event("admission", dstep, True, "CUDA graph", dp))
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def _rank_run(rank: int, world: int, port: int, args: dict) -> dict[str, Any]:
    import torch.distributed as dist

    from sglang_dspark_dp import watch

    pg = common.join_gloo(rank, world, port, args["timeout"])
    group = common.WatchGroup(pg, world)
    rounds: list[dict[str, list[float]]] = []
    # One channel for the run, as a server makes one per group: its thread
    # idles through the off rounds (a wake-up every GATHER_S, no event).
    channel = watch.channel(group)
    if channel is None:
        raise RuntimeError("the watch made no channel for this group")
    entry = (
        (common.site_hook("worker-entry"), common.EntryWorker(group))
        if args["entry"]
        else None
    )
    for _ in range(args["rounds"]):
        row: dict[str, list[float]] = {}
        for variant in ("off", "on"):
            used = channel if variant == "on" else None
            kw = {"draft": args["draft"], "entry": entry}
            _steps(args["warmup"], args["work_us"], used, **kw)
            dist.barrier(group=pg)
            row[variant] = _steps(args["steps"], args["work_us"], used, **kw)
            dist.barrier(group=pg)
        rounds.append(row)
    alarms = watch.shutdown()
    dist.destroy_process_group()
    return {
        "rounds": rounds,
        "alarms": alarms,
        "stopped": channel.stopped,
        "decisions": dict(channel.steps),
    }


def run_world(world: int, args: argparse.Namespace) -> dict[str, Any]:
    """Both variants on ``world`` ranks, per round."""
    shared = {
        "rounds": args.rounds,
        "steps": args.steps,
        "warmup": args.warmup,
        "work_us": args.work_us,
        "timeout": args.timeout,
        "draft": args.draft,
        "entry": args.entry,
    }
    reports = common.run_ranks(_rank_run, world, shared, args.timeout)
    alarms = [a for r in reports.values() for a in r["alarms"]]
    if alarms:
        raise SystemExit(f"{world} ranks: the watch alarmed: {alarms[0]}")
    stopped = {r: rep["stopped"] for r, rep in reports.items() if rep["stopped"]}
    if stopped:  # its figures would be a watch that was not watching
        raise SystemExit(f"{world} ranks: the watch stopped: {stopped}")
    rounds = []
    for i in range(args.rounds):
        per = [reports[r]["rounds"][i] for r in range(world)]
        off = max(statistics.median(p["off"]) for p in per)
        on = max(statistics.median(p["on"]) for p in per)
        total_off = max(sum(p["off"]) for p in per)
        total_on = max(sum(p["on"]) for p in per)
        rounds.append(
            {
                "off_median_us": off,
                "on_median_us": on,
                "added_us": on - off,
                "on_p90_us": max(common.percentile(p["on"], 0.9) for p in per),
                "steps_ratio": total_off / total_on,
            }
        )
    # What the watch was given: each decision's count of steps, rank 0's.
    return {"ranks": world, "rounds": rounds, "decisions": reports[0]["decisions"]}


def render_table(rows: list[dict[str, Any]]) -> str:
    head = ["ranks", "round", "step off (µs)", "step on (µs)", "added (µs)", "on/off"]
    lines = []
    for r in rows:
        for i, rd in enumerate(r["rounds"], 1):
            lines.append(
                [
                    str(r["ranks"]),
                    str(i),
                    f"{rd['off_median_us']:.1f}",
                    f"{rd['on_median_us']:.1f}",
                    f"{rd['added_us']:+.1f}",
                    f"{rd['steps_ratio']:.4f}",
                ]
            )
    out = common.table_lines(head, lines)
    out.append(
        "(median step of the slowest rank; on/off: steps/s with the watch over "
        f"without; goal: added <= {GOAL_US:g} µs and on/off >= {GOAL_RATIO})"
    )
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Host cost per decode step of the consensus watch (CPU gloo)."
    )
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument(
        "--work-us", type=float, default=2000.0, help="host work of one stand-in step"
    )
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument(
        "--draft",
        action="store_true",
        help="also the draft-batch site's calls (a DP-attention decode step)",
    )
    p.add_argument(
        "--entry",
        action="store_true",
        help="also the worker-entry site's real hook (needs SGLang with DSpark)",
    )
    p.add_argument("--out", default=None, help="write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for world in args.ranks:
        if not 2 <= world <= 16:
            raise SystemExit(f"--ranks: each must be between 2 and 16, got {world}")
    for name in ("rounds", "steps"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.warmup < 0 or args.work_us < 0:
        raise SystemExit(
            f"--warmup and --work-us must not be negative, got {args.warmup} "
            f"and {args.work_us}"
        )
    rows = [run_world(world, args) for world in args.ranks]
    result = {
        "benchmark": "watch",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "steps": args.steps,
        "work_us": args.work_us,
        "sites": ["compact-verify"]
        + (["draft-batch"] if args.draft else [])
        + (["worker-entry"] if args.entry else []),
        "rows": rows,
    }
    print(render_table(rows))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
