"""Per-step cost of the verify-budget repair's broadcast, beside upstream's
own per-step DP verify-tier all-gather, on CPU gloo.

The verify-budget repair (``sglang_dspark_dp.srt.speculative.
dspark_components.dspark_planner``) adds, at every decode step where a
verify budget is scheduled (compact or cap-accept ragged verify with a
profiled SPS table) and the ``verify_lens`` group has more than one rank,
one int64 broadcast from the group's first rank over its CPU (gloo) group.
Upstream already pays a collective of the same kind per step in the same
place under DP attention: ``DSparkVerifyPlanner._maybe_gather_dp_verify_tier``
all-gathers one int64 per rank over the TP group's CPU group
(``all_gather_into_tensor``). Both are measured the same way here, in one
process per rank joined by gloo over loopback:

* ``broadcast``: the repair's own ``broadcast_budget`` (tensor in, the
  broadcast, the value out);
* ``all-gather``: the upstream pattern (a one-element int64 tensor, an
  output tensor of one element per rank, ``all_gather_into_tensor`` over the
  CPU group, the values out as a list);
* with SGLang installed (skip with ``--no-planner``): the installed
  ``DSparkVerifyPlanner.compute_budget_sync`` on a CPU planner (16 requests,
  gamma 7, a profiled SPS table), stock and with the repair instrumented, so
  the repair's whole per-step cost shows beside the budget it guards.

Each figure is per call, in microseconds: the median and p90 over
``--iters`` calls of the slowest rank (a collective step costs what its
slowest rank waits). Ranks are separated by a barrier between variants.
On a machine with fewer cores than ranks the ranks share cores, which
inflates every collective alike; the core count is in the JSON.

Usage::

    python benchmark/draft_metadata/bench_budget_sync.py --ranks 2 4 \\
        --iters 2000 --out budget_sync.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

try:  # installed: sglang-dspark-dp-bench
    from sglang_dspark_dp_bench.draft_metadata import bench_common as common
except ImportError:  # run as a script beside bench_common.py (the GPU machine)
    import bench_common as common

VARIANTS = ("broadcast", "all-gather", "budget-stock", "budget-repaired")
LABELS = {
    "broadcast": "budget broadcast (plugin)",
    "all-gather": "DP tier all-gather (upstream pattern)",
    "budget-stock": "compute_budget_sync, stock",
    "budget-repaired": "compute_budget_sync, repaired",
}


class _Group:
    """The parts of a group coordinator the measured code reads."""

    def __init__(self, pg: Any, world: int, rank: int) -> None:
        self.cpu_group = pg
        self.device_group = pg
        self.world_size = world
        self.rank_in_group = rank
        self.ranks = list(range(world))

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        dist.broadcast(tensor, src=self.ranks[src], group=self.cpu_group)
        return tensor


def _time(fn: Any, iters: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def _allgather_step(pg: Any, world: int, value: int) -> list[int]:
    """The upstream per-step DP tier gather pattern."""
    import torch
    import torch.distributed as dist

    local = torch.tensor([value], dtype=torch.int64)
    gathered = torch.empty((world,), dtype=torch.int64)
    dist.all_gather_into_tensor(gathered, local, group=pg)
    return gathered.tolist()


def _planner_calls(group: _Group, world: int, rank: int) -> dict[str, Any]:
    """``compute_budget_sync`` on an installed planner, and the repair."""
    import torch

    from sglang_dspark_dp.adapter import planner as sg_planner
    from sglang_dspark_dp.drivers import planner as standins
    from sglang_dspark_dp.srt.speculative.dspark_components import (
        dspark_planner as budget_repair,
    )

    bs, gamma = 16, 7
    tiers = [bs * k for k in range(1, gamma + 2)]
    table = sg_planner.profiled_sps_table(
        [(t, 100.0 - 6.0 * i) for i, t in enumerate(tiers)],
        max_batch_tokens=tiers[-1],
    )
    module, cls = sg_planner.load_planner()
    rt = standins.runtime(
        tp_size=world, disable_overlap_schedule=False, sps_table_path="<bench>"
    )
    swaps = sg_planner.runtime_swaps(
        module, runtime=rt, group=group, mode=sg_planner.COMPACT, sps_table=table
    )
    runner = standins.model_runner(
        req_pool_size=bs + 1, capture_num_tokens=tiers, max_bs=bs
    )
    rows = torch.arange(1, bs + 1, dtype=torch.int64)
    runner.req_to_token_pool.req_generation[rows] = 1
    with swaps:
        planner = sg_planner.build_planner(
            module,
            cls,
            draft_model=standins.draft_model(),
            model_runner=runner,
            runtime=rt,
            group=group,
            gamma=gamma,
            verify_num_draft_tokens=gamma + 1,
            tp_rank=rank,
        )
    gen = torch.Generator().manual_seed(rank)
    confidence = torch.rand((bs, gamma), generator=gen) * 0.6 + 0.4
    prefix = torch.full((bs,), 64, dtype=torch.int64)

    def step() -> Any:
        return planner.compute_budget_sync(
            confidence=confidence, prefix_lens=prefix, req_pool_indices=rows
        )

    return {"step": step, "swaps": swaps, "repair": budget_repair.REPAIR}


def _rank_run(rank: int, world: int, port: int, args: dict) -> dict[str, Any]:
    import torch.distributed as dist

    pg = common.join_gloo(rank, world, port, args["timeout"])
    group = _Group(pg, world, rank)
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_planner import (
        broadcast_budget,
    )

    iters, warmup = args["iters"], args["warmup"]
    out: dict[str, Any] = {}
    value = 40 + rank  # each rank's own budget; the first rank's wins
    dist.barrier(group=pg)
    got = broadcast_budget(group, value)
    if got != 40:
        raise RuntimeError(f"the broadcast delivered {got}, expected 40")
    out["broadcast"] = _time(lambda: broadcast_budget(group, value), iters, warmup)
    dist.barrier(group=pg)
    out["all-gather"] = _time(lambda: _allgather_step(pg, world, value), iters, warmup)
    if args["planner"]:
        calls = _planner_calls(group, world, rank)
        repair = calls["repair"]
        with calls["swaps"]:
            repair.uninstrument()
            dist.barrier(group=pg)
            out["budget-stock"] = _time(calls["step"], iters, warmup)
            status = repair.instrument(apply=True)
            out["repair"] = status.line()
            dist.barrier(group=pg)
            out["budget-repaired"] = _time(calls["step"], iters, warmup)
            repair.uninstrument()
    dist.barrier(group=pg)
    dist.destroy_process_group()
    return out


def run_world(world: int, args: argparse.Namespace) -> dict[str, Any]:
    """All variants on ``world`` gloo ranks; per variant the slowest rank's
    median and p90 (microseconds per call)."""
    shared = {
        "iters": args.iters,
        "warmup": args.warmup,
        "timeout": args.timeout,
        "planner": args.planner,
    }
    reports = common.run_ranks(_rank_run, world, shared, args.timeout)
    row: dict[str, Any] = {"ranks": world}
    for variant in VARIANTS:
        per_rank = [reports[r].get(variant) for r in range(world)]
        if any(v is None for v in per_rank):
            continue
        row[variant] = {
            "median_us": max(statistics.median(v) for v in per_rank),
            "p90_us": max(common.percentile(v, 0.9) for v in per_rank),
        }
    if "repair" in reports[0]:
        row["repair"] = reports[0]["repair"]
    if "broadcast" in row and "all-gather" in row:
        row["broadcast_over_allgather"] = (
            row["broadcast"]["median_us"] / row["all-gather"]["median_us"]
        )
    if "budget-stock" in row and "budget-repaired" in row:
        row["repair_added_us"] = (
            row["budget-repaired"]["median_us"] - row["budget-stock"]["median_us"]
        )
    return row


def render_table(rows: list[dict[str, Any]]) -> str:
    """One line per rank count; figures are µs per call (median / p90)."""
    variants = [v for v in VARIANTS if any(v in r for r in rows)]
    head = ["ranks"] + [LABELS[v] for v in variants] + ["broadcast / all-gather"]
    lines = []
    for r in rows:
        cells = [str(r["ranks"])]
        for v in variants:
            m = r.get(v)
            cells.append(
                "-" if m is None else f"{m['median_us']:.1f} / {m['p90_us']:.1f}"
            )
        ratio = r.get("broadcast_over_allgather")
        cells.append("-" if ratio is None else f"{ratio:.2f}x")
        lines.append(cells)
    out = common.table_lines(head, lines)
    out.append("(microseconds per call, median / p90 of the slowest rank, CPU gloo)")
    return "\n".join(out)


def _sglang_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        return None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Per-step cost of the verify-budget broadcast vs upstream's "
        "DP tier all-gather (CPU gloo)."
    )
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument(
        "--no-planner",
        dest="planner",
        action="store_false",
        help="skip the compute_budget_sync rows (no SGLang needed)",
    )
    p.add_argument("--out", default=None, help="write the JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for world in args.ranks:
        if not 2 <= world <= 16:
            raise SystemExit(f"--ranks: each must be between 2 and 16, got {world}")
    if args.iters < 1 or args.warmup < 0:
        raise SystemExit("--iters must be at least 1 and --warmup at least 0")
    if args.planner:
        try:  # import SGLang before forking, so the ranks start warm
            from sglang_dspark_dp.adapter import planner as sg_planner

            sg_planner.load_planner()
        except Exception as exc:
            print(
                f"no installed DSpark verify planner ({exc}); measuring the "
                "collectives only",
                file=sys.stderr,
            )
            args.planner = False
    rows = [run_world(world, args) for world in args.ranks]
    result = {
        "benchmark": "budget_sync",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "sglang": _sglang_version() if args.planner else None,
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "iters": args.iters,
        "warmup": args.warmup,
        "rows": rows,
    }
    print(render_table(rows))
    for r in rows:
        if "repair_added_us" in r:
            print(
                f"{r['ranks']} ranks: the repair adds {r['repair_added_us']:.1f} us "
                f"per scheduled step to compute_budget_sync ({r.get('repair', '')})"
            )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
