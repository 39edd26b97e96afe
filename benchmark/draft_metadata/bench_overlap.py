"""What the draft DP fill costs a decode loop run in SGLang's own order.

``bench_fill.py`` times the fill alone. This script asks what a fill that
makes the host wait for the GPU (stock 0.5.17) costs a whole overlapped
decode step, against the plugin's fill and against no fill at all, by
running a decode loop in the order SGLang runs it, with the real fill on a
real ``DraftBlockProposer`` and real batches, and every other host and GPU
part replaced by a parameter: GPU work as ``torch.cuda._sleep`` spins
calibrated with CUDA events, host work as busy-waits.

SGLang's order (read from the installed 0.5.17)
------------------------------------------------

``Scheduler.event_loop_overlap`` (``sglang/srt/managers/scheduler.py``),
once per iteration:

1. receive requests and **schedule the next batch**
   (``get_next_batch_to_run``; under DP attention it ends in
   ``dp_attn_adapter.maybe_prepare_mlp_sync_batch``, the all-gather of the
   per-rank counts over the CPU group): host part ``schedule``;
2. ``run_batch(batch)``: with overlap on, the forward stream first waits for
   the schedule stream, then, on the forward stream,
   ``DSparkWorkerV2.forward_batch_generation`` ->
   ``_forward_decode``
   (``sglang/srt/speculative/dspark_components/dspark_worker_v2.py``):

   a. ``alloc_verify_window``, then ``DraftBlockProposer.propose`` ->
      ``_run_forward``: the draft block ids, the draft ``ForwardBatch`` built
      by hand (host part ``build``), **then the fill**
      (``_fill_dp_moe_sync_metadata``, the real one here);
   b. ``can_run_graph`` and ``draft_model_runner.forward``, the **draft
      launch** (host part ``draft_launch``), whose GPU work is the draft
      forward (GPU part ``draft``);
   c. the host's **verify planning**: confidence,
      ``resolve_verify_token_budget`` (under overlap the budget was
      precomputed into the draft input), ``schedule_layout``,
      ``should_run_compact`` (host part ``plan``);
   d. the **verify launch**, ``run_compact`` / ``run_non_compact`` on the
      verify executor (host part ``verify_launch``), whose GPU work is the
      target verify (GPU part ``verify``);
   e. ``accept_and_finalize``, ``on_publish``, ``commit_hidden``, the next
      draft input (host part ``finish``);

   then, back in ``run_batch``, ``copy_done`` is a new event, the copy
   stream waits for the forward stream and ``copy_to_cpu`` queues the
   result's device-to-host copies there and records ``copy_done``;
3. **the previous batch's result processing** (``pop_and_process`` ->
   ``process_batch_result_decode`` in
   ``sglang/srt/managers/scheduler_components/batch_result_processor.py``),
   which starts with ``result.copy_done.synchronize()``, the one wait on the
   GPU this loop has, and then processes the tokens on the host (host part
   ``result``). (``launch_batch_sample_if_needed`` follows; DSpark has no
   delayed sampling, so it does nothing.)

So the host normally runs one batch ahead of the GPU and waits only in
step 3, for the batch before. The stock 0.5.17 fill makes a CUDA tensor
from a Python int on the forward stream (a blocking copy from pageable
memory), so it waits in 2a for everything queued on that stream, i.e. the
previous batch's verify; the GPU then idles through the host time from the
fill to the draft launch, and through whatever of the planning and verify
launch the draft's GPU time does not cover. Scheduling and result
processing still overlap the GPU.

What is left out: the verify planning of 0.5.17 reads no device value in
its static and verify-all modes (modelled here); its budgeted compact mode
without a captured grid copies ``verify_lens`` to the host in
``schedule_layout``, a wait of its own that the stock fill's wait would
then partly duplicate. Grammar, logprobs and prefill steps are not
modelled. The draft ``ForwardBatch`` is built once before the loop (its
host cost is the ``build`` part), since building one with the suite's
builder reads a device value.

Parameters and grid
-------------------

Each cell of the grid is one decode step's GPU time (``--gpu-ms``, split
``--draft-share`` to the draft and the rest to the verify) and one host
time ``--host-ms`` that every host part takes, times its weight in
``--parts`` (default 1 each: seven parts, so a step's host time is 7x the
cell's). In every cell the three modes run in turn, ``--rounds`` times
(rotating which goes first), ``--steps`` timed steps each after
``--warmup`` steps; steps/s is the median over the rounds, timed from the
start of the first timed step to the start of the step after the last.

Modes: ``stock`` (the installed release's own fill), ``plugin`` (the fill
with this plugin's draft-batch repair instrumented; on a release where the
repair is not needed it is the stock fill, and the table says so), ``none``
(no fill: the floor); asked for with ``--modes``, ``watch`` (the plugin's
fill with the consensus watch on: its real worker-entry and draft-batch
hooks and the compact-verify site's calls on a channel whose other rank is
a CPU process forked before CUDA starts and making the same calls; see
:func:`watched`).

Which cells reflect a DSpark + DP-attention deployment
------------------------------------------------------

DP attention is what SGLang uses for large MoE targets (DeepSeek-class,
the models DSpark drafts for) spread over 4 to 8 or more GPUs with EP; a
decode step there verifies bs x (gamma + 1) tokens per rank through some
60 MoE layers with an all-to-all per layer, which keeps a step at about
10 to 20 ms or more, the draft a small share of it. The host parts are
Python: a scheduler pass with a CPU-group all-gather, building a batch,
launching a CUDA graph, planning the verify, processing the tokens of
tens of requests per rank; 0.3 to 1 ms each is the estimate used here.
So the cells with ``--gpu-ms`` 10 or 20 and ``--host-ms`` 0.3 or 1 are
marked ``*`` as the deployment-like ones. These are estimates of what
such a deployment spends, not measurements of one; the other cells show
how the cost moves (small models, tiny batches, a slow host) and none of
them is a headline.

Usage::

    python benchmark/draft_metadata/bench_overlap.py --out overlap.json
    python benchmark/draft_metadata/bench_overlap.py --out overlap.json \\
        compare --site 0.5.17=$(python3 scripts/device/unpack.py pythonpath 17)

Without CUDA it refuses in one line and exits 2.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as _dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

try:  # installed: sglang-dspark-dp-bench
    from sglang_dspark_dp_bench.draft_metadata import bench_common as common
except ImportError:  # run as a script beside bench_common.py (the GPU machine)
    import bench_common as common

#: Host parts of one decode step, in the order the loop runs them.
HOST_PARTS = (
    "schedule",
    "build",
    "draft_launch",
    "plan",
    "verify_launch",
    "finish",
    "result",
)
MODES = ("stock", "plugin", "none", "watch")
#: What runs unless ``--modes`` says otherwise (``watch`` is asked for).
DEFAULT_MODES = ("stock", "plugin", "none")
#: Target (issue 36): the plugin's loop with the watch on within this
#: fraction of the plugin's loop without it, in the deployment-like cells.
WATCH_VS_PLUGIN_TOLERANCE = 0.01
DEFAULT_GPU_MS = (2.0, 5.0, 10.0, 20.0)
DEFAULT_HOST_MS = (0.05, 0.3, 1.0, 3.0)
#: Cells marked as deployment-like (see the module docstring).
DEPLOYMENT_GPU_MS = (10.0, 20.0)
DEPLOYMENT_HOST_MS = (0.3, 1.0)
#: Target: the plugin's loop within this fraction of the no-fill loop.
PLUGIN_VS_NONE_TOLERANCE = 0.01


# --------------------------------------------------------------------------
# Pure pieces: parsing, the step plan, targets, the table.
# --------------------------------------------------------------------------


def parse_ms_list(text: str | Sequence[str]) -> tuple[float, ...]:
    """``"2,5,10,20"`` (or ``["2", "5"]``, commas or spaces) -> positive ms."""
    items = [text] if isinstance(text, str) else list(text)
    out: list[float] = []
    for item in items:
        for piece in item.replace(",", " ").split():
            try:
                value = float(piece)
            except ValueError:
                raise ValueError(f"not a number of milliseconds: {piece!r}") from None
            if not value > 0 or value != value or value == float("inf"):
                raise ValueError(f"milliseconds must be positive: {piece!r}")
            out.append(value)
    if not out:
        raise ValueError("an empty list of milliseconds")
    return tuple(out)


def parse_parts(text: str | None) -> dict[str, float]:
    """``"schedule=1,plan=0.5"`` -> every host part's weight (default 1)."""
    weights = dict.fromkeys(HOST_PARTS, 1.0)
    if not text:
        return weights
    for piece in text.replace(" ", ",").split(","):
        if not piece:
            continue
        name, sep, value = piece.partition("=")
        if not sep:
            raise ValueError(f"expected PART=WEIGHT, got {piece!r}")
        if name not in weights:
            raise ValueError(
                f"unknown host part {name!r} (known: {', '.join(HOST_PARTS)})"
            )
        try:
            weight = float(value)
        except ValueError:
            raise ValueError(f"not a weight: {piece!r}") from None
        if weight < 0 or weight != weight:
            raise ValueError(f"weights are >= 0: {piece!r}")
        weights[name] = weight
    return weights


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """One cell: each host part's and each GPU part's milliseconds."""

    gpu_ms: float
    host_ms: float
    host: dict[str, float]
    draft_gpu_ms: float
    verify_gpu_ms: float

    @property
    def host_total_ms(self) -> float:
        return sum(self.host.values())

    @property
    def deployment(self) -> bool:
        return is_deployment_cell(self.gpu_ms, self.host_ms)

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_ms": self.gpu_ms,
            "host_ms": self.host_ms,
            "host_parts_ms": dict(self.host),
            "host_total_ms": self.host_total_ms,
            "draft_gpu_ms": self.draft_gpu_ms,
            "verify_gpu_ms": self.verify_gpu_ms,
            "deployment": self.deployment,
        }


def is_deployment_cell(gpu_ms: float, host_ms: float) -> bool:
    return any(abs(gpu_ms - g) < 1e-9 for g in DEPLOYMENT_GPU_MS) and any(
        abs(host_ms - h) < 1e-9 for h in DEPLOYMENT_HOST_MS
    )


def step_plan(
    gpu_ms: float, host_ms: float, weights: dict[str, float], draft_share: float
) -> StepPlan:
    if not 0 <= draft_share <= 1:
        raise ValueError(f"--draft-share must be in [0, 1], got {draft_share}")
    return StepPlan(
        gpu_ms=gpu_ms,
        host_ms=host_ms,
        host={part: host_ms * weights.get(part, 1.0) for part in HOST_PARTS},
        draft_gpu_ms=gpu_ms * draft_share,
        verify_gpu_ms=gpu_ms * (1 - draft_share),
    )


def grid(
    gpu_ms: Iterable[float],
    host_ms: Iterable[float],
    weights: dict[str, float],
    draft_share: float,
) -> list[StepPlan]:
    host_list = list(host_ms)
    return [step_plan(g, h, weights, draft_share) for g in gpu_ms for h in host_list]


def summarize_cell(cell: dict[str, Any]) -> dict[str, Any]:
    """Median steps/s per mode and the ratios, from the rounds' figures."""
    rates = {
        mode: statistics.median(values)
        for mode, values in cell["rounds"].items()
        if values
    }

    def ratio(a: str, b: str) -> float | None:
        if a in rates and b in rates and rates[b] > 0:
            return rates[a] / rates[b]
        return None

    cell["steps_per_s"] = rates
    cell["plugin_over_stock"] = ratio("plugin", "stock")
    cell["stock_over_plugin"] = ratio("stock", "plugin")
    cell["plugin_over_none"] = ratio("plugin", "none")
    cell["stock_over_none"] = ratio("stock", "none")
    cell["watch_over_plugin"] = ratio("watch", "plugin")
    return cell


def evaluate_targets(release: dict[str, Any]) -> list[dict[str, Any]]:
    """Plugin within 1% of no fill in every cell; stock / plugin reported."""
    cells = release.get("cells") or []
    gaps = [c.get("plugin_over_none") for c in cells]
    ok = [None if g is None else g >= 1 - PLUGIN_VS_NONE_TOLERANCE for g in gaps]
    if not ok or any(v is None for v in ok):
        verdict = "n/a"
    else:
        verdict = "met" if all(ok) else "NOT met"
    worst = min((g for g in gaps if g is not None), default=None)
    sop = [c.get("stock_over_plugin") for c in cells]
    dep = [c.get("stock_over_plugin") for c in cells if c["plan"]["deployment"]]

    def span(values: list[float | None]) -> list[float] | None:
        vals = [v for v in values if v is not None]
        return [min(vals), max(vals)] if vals else None

    watch = [c.get("watch_over_plugin") for c in cells if c["plan"]["deployment"]]
    watched = [w for w in watch if w is not None]
    watch_target = {
        "target": "watch on within 1% of the plugin's steps/s in the "
        "deployment-like cells",
        "values": watch,
        "worst": min(watched, default=None),
        "worst_of": "watch/plugin",
        "verdict": "n/a"
        if not watched
        else (
            "met"
            if all(w >= 1 - WATCH_VS_PLUGIN_TOLERANCE for w in watched)
            else "NOT met"
        ),
    }
    return [
        {
            "target": "plugin within 1% of the no-fill loop in every cell",
            "values": gaps,
            "worst": worst,
            "verdict": verdict,
        },
        {
            "target": "stock / plugin steps/s (reported)",
            "values": sop,
            "all_cells": span(sop),
            "deployment_cells": span(dep),
            "verdict": "reported",
        },
        *([watch_target] if watched else []),
    ]


def _fmt(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def render_table(release: dict[str, Any]) -> str:
    """One row per cell; ``*`` marks the deployment-like cells."""
    head = [
        "GPU ms/step",
        "host ms/part",
        "host ms/step",
        "stock steps/s",
        "plugin steps/s",
        "no-fill steps/s",
        "plugin/stock",
        "plugin/no-fill",
    ]
    cells = release.get("cells") or []
    watched = any("watch" in (c.get("steps_per_s") or {}) for c in cells)
    if watched:
        head += ["watch steps/s", "watch/plugin"]
    rows = []
    for cell in cells:
        plan = cell["plan"]
        rates = cell.get("steps_per_s") or {}
        mark = "*" if plan["deployment"] else ""
        rows.append(
            [
                f"{plan['gpu_ms']:g}{mark}",
                f"{plan['host_ms']:g}{mark}",
                f"{plan['host_total_ms']:.2f}",
                _fmt(rates.get("stock"), ".1f"),
                _fmt(rates.get("plugin"), ".1f"),
                _fmt(rates.get("none"), ".1f"),
                _fmt(cell.get("plugin_over_stock"), ".3f"),
                _fmt(cell.get("plugin_over_none"), ".3f"),
            ]
        )
        if watched:
            rows[-1] += [
                _fmt(rates.get("watch"), ".1f"),
                _fmt(cell.get("watch_over_plugin"), ".3f"),
            ]
    return "\n".join(common.table_lines(head, rows))


def render_targets(targets: list[dict[str, Any]]) -> str:
    parts = []
    for t in targets:
        if t["verdict"] == "reported":
            all_cells, dep = t.get("all_cells"), t.get("deployment_cells")
            text = f"{t['target']}: "
            text += (
                "n/a"
                if all_cells is None
                else f"{all_cells[0]:.3f}-{all_cells[1]:.3f} over all cells"
            )
            if dep is not None:
                text += f", {dep[0]:.3f}-{dep[1]:.3f} in the * cells"
            parts.append(text)
        else:
            worst = t.get("worst")
            label = t.get("worst_of", "plugin/no-fill")
            extra = "" if worst is None else f" (worst {label} {worst:.3f})"
            parts.append(f"{t['target']}: {t['verdict']}{extra}")
    return "targets: " + "; ".join(parts)


# --------------------------------------------------------------------------
# The loop.
# --------------------------------------------------------------------------


def busy_wait(ms: float, clock: Callable[[], int] = time.perf_counter_ns) -> None:
    """Keep the host busy (and the GIL held) for ``ms`` milliseconds."""
    if ms <= 0:
        return
    end = clock() + int(ms * 1e6)
    while clock() < end:
        pass


class CudaOps:
    """The device side of the loop: SGLang's three streams, calibrated GPU
    spins, and the result copy with its ``copy_done`` event."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.cycles_per_ms = calibrate_spin(torch)
        self.schedule_stream = torch.cuda.current_stream()
        self.forward_stream = torch.cuda.Stream()
        self.copy_stream = torch.cuda.Stream()
        self.result = torch.zeros(64, dtype=torch.int64, device="cuda")
        self.host = [
            torch.empty(64, dtype=torch.int64, pin_memory=True) for _ in range(2)
        ]

    @contextlib.contextmanager
    def forward(self):
        """``run_batch``'s forward-stream context (after it waited for the
        schedule stream)."""
        self.forward_stream.wait_stream(self.schedule_stream)
        with self.torch.cuda.stream(self.forward_stream):
            yield

    def gpu(self, ms: float) -> None:
        if ms > 0:
            self.torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def copy_out(self, slot: int) -> Any:
        """The result's device-to-host copy on the copy stream; its event."""
        done = self.torch.cuda.Event()
        self.copy_stream.wait_stream(self.forward_stream)
        with self.torch.cuda.stream(self.copy_stream):
            self.host[slot % 2].copy_(self.result, non_blocking=True)
            done.record()
        return done

    def drain(self) -> None:
        self.torch.cuda.synchronize()

    def measure_spin(self, ms: float, reps: int = 3) -> float:
        """Median event-timed milliseconds of ``gpu(ms)`` on an idle GPU."""
        torch = self.torch
        out = []
        for _ in range(reps):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            self.gpu(ms)
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        return statistics.median(out)


def calibrate_spin(torch: Any, target_ms: float = 50.0) -> float:
    """Cycles of ``torch.cuda._sleep`` per millisecond, from CUDA events."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # load the kernel
    torch.cuda.synchronize()
    rate = 0.0
    for _ in range(2):  # the second pass at ~target_ms, past clock ramp-up
        rate = common.sleep_cycles_per_ms(torch, cycles)
        cycles = int(rate * target_ms)
    return rate


def run_loop(
    ops: Any,
    plan: StepPlan,
    fill: Callable[[int], None] | None,
    schedule: Callable[[int], None],
    *,
    steps: int,
    warmup: int,
    wait: Callable[[float], None] = busy_wait,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Run ``warmup + steps`` decode steps in SGLang's order; steps/s of the
    timed ones (start of the first to start of the one after the last).

    ``fill(i)`` runs the draft fill of step ``i`` (``None``: no fill);
    ``schedule(i)`` gives step ``i``'s batch its all-gathered counts."""
    host = plan.host
    pending = None
    t_start = t_end = 0.0
    total = warmup + steps
    for i in range(total + 1):
        if i == warmup:
            t_start = clock()
        if i == total:
            t_end = clock()
            break
        # 1. schedule the next batch (incl. the DP all-gather of the counts)
        wait(host["schedule"])
        schedule(i)
        # 2. run_batch on the forward stream
        with ops.forward():
            wait(host["build"])  # verify window, draft ids, draft ForwardBatch
            if fill is not None:
                fill(i)  # _fill_dp_moe_sync_metadata
            wait(host["draft_launch"])  # can_run_graph, draft forward launch
            ops.gpu(plan.draft_gpu_ms)
            wait(host["plan"])  # confidence, budget, layout
            wait(host["verify_launch"])  # run_compact / run_non_compact
            ops.gpu(plan.verify_gpu_ms)
            wait(host["finish"])  # accept, on_publish, commit, next input
        done = ops.copy_out(i)  # copy stream, copy_done recorded
        # 3. the previous batch's result processing
        if pending is not None:
            pending.synchronize()
            wait(host["result"])
        pending = done
    if pending is not None:
        pending.synchronize()
    ops.drain()
    return steps / max(t_end - t_start, 1e-9)


def run_cell(
    ops: Any,
    plan: StepPlan,
    fills: dict[str, Callable[[int], None] | None],
    schedule: Callable[[int], None],
    *,
    steps: int,
    warmup: int,
    rounds: int,
    modes: Sequence[str],
    wait: Callable[[float], None] = busy_wait,
) -> dict[str, Any]:
    """Every mode ``rounds`` times, the first one rotating each round."""
    values: dict[str, list[float]] = {m: [] for m in modes}
    order = list(modes)
    for r in range(rounds):
        turn = order[r % len(order) :] + order[: r % len(order)]
        for mode in turn:
            values[mode].append(
                run_loop(
                    ops,
                    plan,
                    fills[mode],
                    schedule,
                    steps=steps,
                    warmup=warmup,
                    wait=wait,
                )
            )
    return summarize_cell({"plan": plan.as_dict(), "rounds": values})


# --------------------------------------------------------------------------
# One release: the real proposer, batches and fills.
# --------------------------------------------------------------------------


def build_fills(
    *,
    device: str,
    dp: int,
    bs: int,
    gamma: int | None,
    counts_mode: str,
    watch_group: Any = None,
) -> tuple[dict[str, Any], Callable[[int], None], dict[str, Any], Any]:
    """The real fills of the installed SGLang on a real proposer and real
    batches: ``{"stock": f, "plugin": f, "none": None}``, the per-step
    schedule callback, a description, and ``close()``, which the caller
    calls when done (it leaves the parallel override and puts the repair
    back as it found it).

    With ``watch_group`` (a group of this rank and its peers, as
    ``bench_common.WatchGroup``), also ``"watch"``: the plugin's fill
    through the watch's real draft-batch hook, after its real worker-entry
    hook and before the compact-verify site's calls (:func:`watched`), on
    the watch's channel of that group."""
    import torch

    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH, builders
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    gamma = DRAFT_WIDTH if gamma is None else gamma
    api = adapter.load_sglang_api()
    was_instrumented = REPAIR.instrumented
    if was_instrumented:
        stock = REPAIR.original
    else:
        stock = getattr(api.proposer_cls, adapter.FILL)
    status = REPAIR.instrument(apply=True)
    plugin = getattr(api.proposer_cls, adapter.FILL)
    plugin_active = plugin is not stock
    plan = REPAIR.plan if REPAIR.instrumented else None

    override = adapter.parallel_override(
        api.get_parallel, dp_size=dp, dp_rank=0, ep_size=dp
    )
    override.__enter__()

    def close() -> None:
        override.__exit__(None, None, None)
        if not was_instrumented:
            REPAIR.uninstrument()

    try:
        proposer = builders.build_draft_proposer(
            api,
            draft_model_runner=builders.DeviceOnlyRunner(torch.device(device)),
            gamma=gamma,
            dp_moe_sync=True,
        )
        spec = adapter.draft_spec_info(proposer)
        width = adapter.draft_width(proposer)
        counts = [bs] + [(bs // 2 if r % 2 == 0 else 0) for r in range(1, dp)]
        other = list(counts)
        other[0] = bs - 1 if bs > 1 else bs + 1
        if dp > 1:
            other[1] += 1
        sequence = [counts] if counts_mode == "steady" else [counts, other]
        pairs = []
        for c in sequence:
            fb = builders.make_draft_forward_batch(
                api, bs=c[0], width=width, spec_info=spec, device=device
            )
            batch = builders.make_schedule_batch(
                api,
                seq_lens=torch.full((c[0],), 8, dtype=torch.int64, device=device),
                global_num_tokens=list(c),
            )
            pairs.append((fb, batch, c))
        k = len(pairs)

        def schedule(i: int) -> None:
            # The all-gather hands each step a new list of counts.
            _, batch, c = pairs[i % k]
            batch.global_num_tokens = list(c)
            batch.global_num_tokens_for_logprob = list(c)

        def make(fn: Any) -> Callable[[int], None]:
            def fill(i: int) -> None:
                fb, batch, _ = pairs[i % k]
                fn(proposer, fb, batch)

            return fill

        fills = {"stock": make(stock), "plugin": make(plugin), "none": None}
        if watch_group is not None:
            proposer.draft_model_runner.tp_group = watch_group
            fills["watch"] = watched(proposer, pairs, plugin, watch_group)
        # First calls off the clock (the watch's: its channel made).
        for f in (fills["stock"], fills["plugin"], fills.get("watch")):
            if f is None:
                continue
            for i in range(PREWARM_ROUNDS * k):
                schedule(i)
                f(i)
        if device == "cuda":
            torch.cuda.synchronize()
    except BaseException:
        close()
        raise
    if plugin_active and plan is not None and plan.dp_groups and plan.dp_calls_stock:
        plugin_fill = "stock + plugin"
    elif plugin_active and plan is not None and plan.dp_groups:
        plugin_fill = "plugin"
    elif plugin_active:
        plugin_fill = "stock (hook pass-through)"
    else:
        plugin_fill = f"stock (repair {status.outcome.value})"
    info = {
        "plugin_fill": plugin_fill,
        "repair": status.as_dict(),
        "counts": [list(c) for _, _, c in pairs],
        "counts_mode": counts_mode,
        "dp": dp,
        "bs": bs,
        "gamma": gamma,
        "width": width,
    }
    return fills, schedule, info, close


#: Calls of each fill before the clock starts, per batch of the sequence.
PREWARM_ROUNDS = 2


def watched(
    proposer: Any, pairs: list[Any], plugin: Any, group: Any
) -> Callable[[int], None]:
    """Step ``i``'s calls with the watch on, as a server makes them on the
    scheduler thread: the worker-entry site's hook around a step body, the
    draft-batch site's hook around the plugin's fill, the compact-verify
    site's notes (its planner is not run here)."""
    from sglang_dspark_dp import watch

    entry = common.site_hook("worker-entry")
    draft = common.site_hook("draft-batch")
    worker = common.EntryWorker(group)
    k = len(pairs)
    # The group's channel, looked up once (the hooks make it at their first
    # call; the lookup takes the watch's lock): the verify site's planner
    # keeps its group's channel too.
    found: list[Any] = []

    def fill(i: int) -> None:
        fb, batch, _ = pairs[i % k]
        entry(common.entry_body, worker, i)
        draft(plugin, proposer, fb, batch)
        if not found:
            found.append(watch.channel(group))
        if found[0] is not None:
            common.note_verify_step(found[0], i)

    return fill


def watch_calls(args: argparse.Namespace, cells: int, k: int) -> list[int]:
    """The step indices the watched fill is called with, in order, in a run
    of ``args`` over ``cells`` cells (``k`` batches): what the peer repeats."""
    calls = list(range(PREWARM_ROUNDS * k))
    for _ in range(cells * args.rounds):
        calls += range(args.warmup + args.steps)
    return calls


def run_watch_peer(args: argparse.Namespace, port: int) -> list[str]:
    """The watch's peer rank, on CPU: the same real fills and hooks, called
    with the same steps as rank 0 calls its watched fill, so every decision
    agrees; then it waits for rank 0 and compares the rest. Its alarms."""
    import torch.distributed as dist

    from sglang_dspark_dp import watch

    pg = common.join_gloo(1, 2, port, args.child_timeout)
    group = common.WatchGroup(pg, 2)
    fills, schedule, info, close = build_fills(
        device="cpu",
        dp=args.dp,
        bs=args.bs,
        gamma=args.gamma,
        counts_mode=args.counts,
        watch_group=group,
    )
    try:
        plans = grid(args.gpu_ms, args.host_ms, parse_parts(args.parts), 0.2)
        k = len(info["counts"])
        for i in watch_calls(args, len(plans), k)[PREWARM_ROUNDS * k :]:
            schedule(i)
            fills["watch"](i)
    finally:
        close()
    dist.barrier(group=pg)  # rank 0's loop is done
    return watch.shutdown()


def _peer_main(args: argparse.Namespace, port: int, out: Any) -> None:
    try:
        alarms = run_watch_peer(args, port)
    except Exception as exc:
        alarms = [f"the peer rank failed: {type(exc).__name__}: {exc}"]
    out.put(alarms)


def _start_watch_peer(args: argparse.Namespace, port: int) -> tuple[Any, Any]:
    """The peer rank, forked before this process starts CUDA (it has
    SGLang imported already, and never touches the GPU)."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_peer_main, args=(args, port, out), daemon=True)
    proc.start()
    return proc, out


def _watch_env() -> dict[str, str]:
    from sglang_dspark_dp import settings

    return {settings.WATCH_MODE_ENV: "log"}


def run_release(
    args: argparse.Namespace,
    *,
    ops: Any = None,
    device: str = "cuda",
    wait: Callable[[float], None] = busy_wait,
) -> dict[str, Any]:
    """Every cell of the grid on this release (``ops``: the device side,
    CUDA's unless given; a stand-in and ``device="cpu"`` run the same loop
    and fills untimed, as the CPU tests do)."""
    import torch

    weights = parse_parts(args.parts)
    plans = grid(args.gpu_ms, args.host_ms, weights, args.draft_share)
    peer = group = None
    if "watch" in args.modes:
        # A mismatch fails the run (logged), it does not end a rank.
        os.environ.update(_watch_env())
        port = common.free_port()
        peer = _start_watch_peer(args, port)
        group = common.WatchGroup(common.join_gloo(0, 2, port, args.child_timeout), 2)
    ops = CudaOps(torch) if ops is None else ops
    cuda = isinstance(ops, CudaOps)
    fills, schedule, info, close = build_fills(
        device=device,
        dp=args.dp,
        bs=args.bs,
        gamma=args.gamma,
        counts_mode=args.counts,
        watch_group=group,
    )
    result: dict[str, Any] = {
        "sglang": common.sglang_version(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device_name": torch.cuda.get_device_name() if cuda else device,
        "cycles_per_ms": ops.cycles_per_ms if cuda else None,
        "spin_check_ms": {
            f"{g:g}": ops.measure_spin(g) for g in sorted(set(args.gpu_ms))
        }
        if cuda
        else {},
        "params": {
            "steps": args.steps,
            "warmup": args.warmup,
            "rounds": args.rounds,
            "modes": list(args.modes),
            "draft_share": args.draft_share,
            "part_weights": weights,
        },
        **info,
    }
    cells = []
    try:
        for plan in plans:
            cell = run_cell(
                ops,
                plan,
                fills,
                schedule,
                steps=args.steps,
                warmup=args.warmup,
                rounds=args.rounds,
                modes=args.modes,
                wait=wait,
            )
            cells.append(cell)
            rates = cell["steps_per_s"]
            print(
                f"[{result['sglang']}] gpu {plan.gpu_ms:g} ms host {plan.host_ms:g} "
                "ms/part: "
                + "  ".join(f"{m} {rates[m]:.1f}/s" for m in args.modes if m in rates),
                file=sys.stderr,
                flush=True,
            )
    finally:
        close()
    result["cells"] = cells
    result["targets"] = evaluate_targets(result)
    if peer is not None:
        result["watch"] = finish_watch(group, peer, args.child_timeout)
        if result["watch"]["failed"]:
            result["error"] = f"the watch failed: {result['watch']['failed']}"
    return result


def finish_watch(group: Any, peer: tuple[Any, Any], timeout: float) -> dict:
    """Rank 0's end of the watched run: meet the peer, compare the rest,
    and what the watch saw (its decisions' counts, alarms, a stop)."""
    import torch.distributed as dist

    from sglang_dspark_dp import watch

    channel = watch.channel(group)
    dist.barrier(group=group.cpu_group)
    alarms = watch.shutdown()
    proc, out = peer
    try:
        peer_alarms = out.get(timeout=timeout)
    except Exception:
        peer_alarms = [f"the peer rank said nothing (exit {proc.exitcode})"]
    proc.join(timeout=30)
    stopped = channel.stopped if channel is not None else "no channel was made"
    failed = alarms[:1] or peer_alarms[:1] or ([stopped] if stopped else [])
    return {
        "decisions": dict(channel.steps) if channel is not None else {},
        "alarms": alarms,
        "peer_alarms": peer_alarms,
        "stopped": stopped,
        "failed": failed[0] if failed else "",
    }


# --------------------------------------------------------------------------
# compare: one child per release, one table each.
# --------------------------------------------------------------------------


def _worker_argv(args: argparse.Namespace, out: Path) -> list[str]:
    argv = [
        "--steps", str(args.steps),
        "--warmup", str(args.warmup),
        "--rounds", str(args.rounds),
        "--gpu-ms", ",".join(f"{g:g}" for g in args.gpu_ms),
        "--host-ms", ",".join(f"{h:g}" for h in args.host_ms),
        "--draft-share", str(args.draft_share),
        "--dp", str(args.dp),
        "--bs", str(args.bs),
        "--counts", args.counts,
        "--modes", *args.modes,
        "--out", str(out),
    ]  # fmt: skip
    if args.parts:
        argv += ["--parts", args.parts]
    if args.gamma is not None:
        argv += ["--gamma", str(args.gamma)]
    return argv


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    releases = []
    for label, py, site in common.compare_targets(args):
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "r.json"
            cmd = [py, str(Path(__file__).resolve()), *_worker_argv(args, out)]
            t0 = time.monotonic()
            proc = subprocess.run(
                cmd,
                stdout=subprocess.PIPE,
                stderr=None,  # progress lines go straight through
                text=True,
                env=common.child_env(site),
                timeout=args.child_timeout,
            )
            if proc.returncode == 0 and out.exists():
                r = json.loads(out.read_text())["releases"][0]
            else:
                tail = (proc.stdout or "").strip().splitlines()[-15:]
                r = {"error": f"child exited {proc.returncode}", "log_tail": tail}
                print(f"[{label}] FAILED (exit {proc.returncode})", file=sys.stderr)
            r["label"] = label
            r["child_s"] = round(time.monotonic() - t0, 1)
            releases.append(r)
    return combine(releases)


def combine(releases: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device_name": next(
            (r["device_name"] for r in releases if "device_name" in r), None
        ),
        "torch": next((r["torch"] for r in releases if "torch" in r), None),
        "deployment_cells": {
            "gpu_ms": list(DEPLOYMENT_GPU_MS),
            "host_ms": list(DEPLOYMENT_HOST_MS),
        },
        "releases": releases,
    }


def print_report(combined: dict[str, Any]) -> None:
    print(f"device: {combined['device_name']}  torch {combined['torch']}")
    for r in combined["releases"]:
        if "error" in r:
            print(f"\n[{r.get('label')}] {r['error']}")
            continue
        p = r["params"]
        print(
            f"\nsglang {r['sglang']}: plugin mode runs {r['plugin_fill']}; "
            f"dp {r['dp']}, bs {r['bs']}, width {r['width']}, counts "
            f"{r['counts_mode']}; {p['steps']} steps x {p['rounds']} rounds per "
            f"mode and cell; draft share {p['draft_share']:g}; "
            "* = deployment-like cell"
        )
        print(render_table(r))
        print(render_targets(r["targets"]))


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def _ms_list(text: str) -> tuple[float, ...]:
    try:
        return parse_ms_list(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Decode loop in SGLang's overlap order: stock vs plugin vs "
        "no draft DP fill (needs CUDA)."
    )
    p.add_argument("--gpu-ms", type=_ms_list, default=DEFAULT_GPU_MS,
                   help="GPU ms per decode step, e.g. 2,5,10,20")  # fmt: skip
    p.add_argument("--host-ms", type=_ms_list, default=DEFAULT_HOST_MS,
                   help="ms of each host part, e.g. 0.05,0.3,1,3")  # fmt: skip
    p.add_argument("--parts", default=None,
                   help="host part weights, e.g. schedule=1,result=2 (default 1 "
                   "each; parts: " + ", ".join(HOST_PARTS) + ")")  # fmt: skip
    p.add_argument("--draft-share", type=float, default=0.2,
                   help="share of a step's GPU time that is the draft")  # fmt: skip
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(DEFAULT_MODES),
                   help="watch: the plugin with the consensus watch on (a CPU "
                   "peer rank mirrors its decisions over gloo)")  # fmt: skip
    p.add_argument("--counts", choices=("steady", "churn"), default="steady",
                   help="same counts every step, or counts changing every step")  # fmt: skip
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--bs", type=int, default=8)
    p.add_argument("--gamma", type=int, default=None)
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--child-timeout", type=float, default=3600)
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("compare", help="one child per SGLang, one table each")
    c.add_argument("--python", action="append", default=[], metavar="LABEL=PYTHON")
    c.add_argument("--site", action="append", default=[], metavar="LABEL=DIR")
    return p


def cuda_refusal() -> str | None:
    """Why this machine cannot run the loop (one line), or None."""
    # NVML's count, not CUDA's: asking leaves CUDA uninitialized here, so
    # the watch mode's peer rank can still be forked (it never uses CUDA).
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    try:
        import torch
    except Exception as exc:
        return f"needs torch with CUDA (torch is not importable: {exc})"
    try:
        ok = torch.cuda.is_available()
    except Exception as exc:  # a broken driver: say so, do not crash
        return f"needs a CUDA GPU (torch.cuda.is_available() raised {exc!r})"
    if not ok:
        return "needs a CUDA GPU (torch.cuda.is_available() is False)"
    return None


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    why = cuda_refusal()
    if why is not None:
        print(f"bench_overlap.py: {why}; nothing was run", file=sys.stderr)
        return 2
    if args.command == "compare":
        combined = run_compare(args)
    else:
        combined = combine([run_release(args)])
    if args.out:
        Path(args.out).write_text(json.dumps(combined, indent=1, default=str) + "\n")
    ok = all("error" not in r for r in combined["releases"])
    print_report(combined)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
