"""The startup-capture repair: every rank of the draft's capture group
decides draft CUDA-graph capture from the same free-memory figure.

Counterpart of ``sglang/srt/speculative/dspark_components/dspark_worker_v2.py``
(SGLang issue #39886). ``DSparkWorkerV2.init_cuda_graphs`` skips draft
capture when less than 1 GiB is free. On 0.5.16-0.5.18 it calls
``get_available_gpu_memory`` by the worker module's own name and reads only
this rank's free memory (and the folded-sampling decision of 0.5.17-0.5.18
reads its own the same way). Ranks on opposite sides of the cutoff then
disagree: the capturing ranks wait in ``FullCudaGraphBackend``'s capture
barriers on the TP group for ranks that never come, and startup hangs.
Upstream moved the reading into ``SpecTpSync`` (PR #33614, 0.5.19), which
reduces it under plain TP; under DP attention with attention TP 1 it stays
rank-local until PR #39954 (in no release yet). This repair stands in for
both on releases that read memory by the worker module's name; from 0.5.19
the reading goes through ``SpecTpSync.available_memory_gb``, and the
capture-group-memory repair makes it there, at #39954's depth.

The hook is an AROUND hook on ``init_cuda_graphs``. For that call only, the
worker module's name for the helper (and the draft sampler module's, where
it has one) asks for the reading with ``distributed=True`` over the capture
group's ``cpu_group``; SGLang's own helper then all-reduces the minimum.
Nothing is reimplemented: the reading, the reduction and the decision are
SGLang's.

Why the reduction cannot deadlock: every rank of the capture group runs
``init_cuda_graphs`` once at startup, with the same server arguments and the
same platform (they are one pipeline stage's TP ranks, so ``_hosts_draft``
is the same for all of them). Whether the stock code reads memory at all
depends only on that configuration, never on a rank's own state, so either
every rank of the group enters the reduction or none does, and they enter it
at the same point of startup. Cost: one small CPU-group (gloo) all-reduce of
one float per process at startup; nothing per step.

Nothing is decided by version string. :func:`probe` runs the installed
``init_cuda_graphs`` on CPU on a stand-in worker whose capture group has two
ranks (``SpecTpSync``, where the release has it, built on a one-rank group
as under DP attention with attention TP 1), with a recorder in place of the
memory helper, and looks at how the reading is requested. Already reduced
over the capture group, or taken through ``SpecTpSync`` (0.5.19 on):
nothing is patched here. Then the same probe runs through the hook to check
that the hook makes it so.

At call time: a worker that does not host the draft, or whose capture group
has one rank, goes straight to the original. If the capture group cannot be
found, one warning line is logged and the original runs unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import INIT_GRAPHS, STARTUP_TARGET
from sglang_dspark_dp.adapter import spec_sync as sg_sync
from sglang_dspark_dp.consensus import GroupVerdict
from sglang_dspark_dp.drivers import worker as standins
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.upstream import State, Verdict

logger = logging.getLogger("sglang_dspark_dp")

#: How the installed release asks for its reading.
SHAPE_MODULE_NAME = "module-name"  # the worker module's name for the helper
SHAPE_TP_SYNC = "tp-sync"  # SpecTpSync.available_memory_gb

#: The upstream changes this repair stands in for.
SPEC_TP_SYNC = "spec-tp-sync"
CAPTURE_GROUP = "capture-group-memory"

#: What the probe's recorder answers (above the cutoff: the stock code then
#: takes its capture path and logs nothing).
_PROBE_GIB = 2.0


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """How ``init_cuda_graphs`` asked for its free-memory reading."""

    readings: tuple[standins.MemoryReading, ...]
    via_tp_sync: bool  # it went through the worker's SpecTpSync
    capture_cpu_group: Any  # the stand-in capture group's token
    captured: bool | None  # what the stand-in draft worker was told

    @property
    def reduced(self) -> bool:
        """Every reading (the capture decision's, and the folded-sampling
        decision's where it reads its own) was requested distributed over
        the capture group."""
        return bool(self.readings) and all(
            r.distributed and r.cpu_group is self.capture_cpu_group
            for r in self.readings
        )

    @property
    def shape(self) -> str | None:
        if self.via_tp_sync:
            return SHAPE_TP_SYNC
        if any(r.where == adapter.WORKER_MODULE for r in self.readings):
            return SHAPE_MODULE_NAME
        return None

    def describe(self) -> str:
        if not self.readings:
            return "no free-memory reading"
        parts = []
        for r in self.readings:
            how = (
                "reduced over the capture group"
                if r.distributed and r.cpu_group is self.capture_cpu_group
                else "rank-local"
            )
            via = (
                "SpecTpSync.available_memory_gb"
                if self.via_tp_sync and r.where != adapter.WORKER_MODULE
                else f"{r.where.rpartition('.')[2]}.{adapter.MEMORY_HELPER}"
            )
            text = f"{how} (via {via}, distributed={r.distributed})"
            if text not in parts:
                parts.append(text)
        return "; ".join(parts)


@isolated
def probe(module: Any, cls: type, around: Any = None) -> ProbeResult:
    """Run the installed ``init_cuda_graphs`` (as SGLang wrote it, under any
    applied hook; through ``around`` if given) on a CPU stand-in; record how
    the reading is asked for. Raises DidNotEnable when the installed method
    cannot be driven that way."""
    group = standins.ProbeGroup(world_size=2)
    singleton = standins.ProbeGroup(world_size=1)
    told: list[bool] = []
    try:
        worker = standins.WorkerStandIn(
            module,
            cls,
            capture_group=group,
            dp_tp_group=singleton,
            on_capture=told.append,
        )
    except Exception as exc:
        raise DidNotEnable(
            f"could not build a stand-in for {adapter.WORKER}: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    calls: list[Any] = []
    swaps = []
    tp_sync = adapter.tp_sync_of(worker)
    if tp_sync is not None:
        # SpecTpSync's reading as SGLang wrote it, whatever hook this process
        # applied to it (capture-group-memory's): the probe judges the build.
        stock = functools.partial(sg_sync.stock_reading(type(tp_sync)), tp_sync)

        @functools.wraps(stock)
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(args)
            return stock(*args, **kwargs)

        swaps.append((tp_sync, "available_memory_gb", counted))
    fn = adapter.stock_init_graphs(cls)
    recorded = standins.RecordedReadings(
        adapter.memory_helper_sites(module, worker), value=_PROBE_GIB
    )
    try:
        with adapter.pretend_cuda(module), adapter.AttrSwap(*swaps), recorded:
            if around is None:
                fn(worker)
            else:
                around(fn, worker)
    except Exception as exc:
        raise DidNotEnable(
            f"could not drive the installed {adapter.WORKER}.{INIT_GRAPHS} on a "
            f"CPU stand-in: {type(exc).__name__}: {exc}"
        ) from exc
    return ProbeResult(
        readings=tuple(recorded.readings),
        via_tp_sync=bool(calls),
        capture_cpu_group=group.cpu_group,
        captured=told[-1] if told else None,
    )


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    """What the probe found of #33614 and #39954 (on releases that read
    through ``SpecTpSync``, #39954 is the capture-group-memory repair's to
    judge)."""
    text = f"the startup reading is {result.describe()}"
    if result.via_tp_sync:
        return (
            Verdict(
                SPEC_TP_SYNC,
                State.IN,
                "the startup reading goes through SpecTpSync.available_memory_gb",
            ),
        )
    if result.reduced:
        return (
            Verdict(SPEC_TP_SYNC, State.IN, text),
            Verdict(CAPTURE_GROUP, State.IN, text),
        )
    return (
        Verdict(SPEC_TP_SYNC, State.NOT_IN, f"{text}, under plain TP too"),
        Verdict(
            CAPTURE_GROUP, State.NOT_IN, f"{text}, under DP attention (attention TP 1)"
        ),
    )


def _stock_decision(original: Any, worker: Any, args: Any, kwargs: Any, why: str):
    logger.warning(
        "sglang-dspark-dp: startup-capture: %s; draft CUDA-graph capture is "
        "decided from this rank's own free memory (stock behaviour)",
        why,
    )
    return original(worker, *args, **kwargs)


def make_around(module: Any, shape: str | None, verdict: GroupVerdict) -> Any:
    """The AROUND hook on ``init_cuda_graphs`` for the probed ``shape``
    (None: this rank's probe failed; the hook only agrees with its group
    that every rank runs stock)."""

    def reduce_startup_reading(original: Any, worker: Any, *args: Any, **kwargs: Any):
        if not adapter.hosts_draft(worker):
            return original(worker, *args, **kwargs)
        found = adapter.capture_group(worker)
        if found is None:
            return _stock_decision(
                original,
                worker,
                args,
                kwargs,
                "the draft capture group was not found on the worker (looked at "
                + ", ".join(adapter.CAPTURE_GROUP_SOURCES)
                + ")",
            )
        group, _where = found
        if group.world_size <= 1:
            return original(worker, *args, **kwargs)
        if not verdict.agree(group.cpu_group, group.world_size) or shape is None:
            return original(worker, *args, **kwargs)
        try:
            swap = adapter.reduced_module_reading(module, group)
        except Exception as exc:
            return _stock_decision(
                original, worker, args, kwargs, f"cannot redirect the reading ({exc})"
            )
        with swap:
            return original(worker, *args, **kwargs)

    return reduce_startup_reading


class StartupCaptureRepair(Repair):
    """Reduces the draft worker's startup free-memory reading to the capture
    group's minimum, so all its ranks capture or all skip."""

    name = "startup-capture"
    stands_in_for = (SPEC_TP_SYNC, CAPTURE_GROUP)

    def __init__(self) -> None:
        super().__init__()
        self.probe_result: ProbeResult | None = None
        self.shape: str | None = None

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        module, cls = adapter.load_worker()
        return verdicts(probe(module, cls))

    def setup_once(self) -> Hook | NotNeeded:
        module, cls = adapter.load_worker()
        adapter.hook_registry()  # DidNotEnable without SGLang's plugin API
        stock = probe(module, cls)
        self.probe_result = stock
        self.found(verdicts(stock))
        detail: dict[str, Any] = {
            "target": STARTUP_TARGET,
            "stock_reading": stock.describe(),
            "cutoff_gib": adapter.CAPTURE_CUTOFF_GIB,
        }
        if stock.via_tp_sync:
            return NotNeeded(
                "the DSpark draft worker takes its startup free-memory reading "
                "through SpecTpSync.available_memory_gb, where capture-group-memory "
                "repairs it; nothing patched here",
                detail,
            )
        if stock.reduced:
            return NotNeeded(
                "the DSpark draft worker already reduces its startup free-memory "
                "reading over the capture group; nothing patched",
                detail,
            )
        if not stock.readings:
            raise DidNotEnable(
                f"{adapter.WORKER}.{INIT_GRAPHS} read no free memory through "
                f"{adapter.MEMORY_HELPER} on the probe; its capture decision is "
                "not one this repair can reach"
            )
        shape = stock.shape
        if shape != SHAPE_MODULE_NAME:
            raise DidNotEnable(
                f"{adapter.WORKER}.{INIT_GRAPHS} reads free memory in a way this "
                f"repair cannot redirect ({stock.describe()})"
            )
        around = make_around(module, shape, GroupVerdict(self.name, True))
        check = probe(module, cls, around=around)
        if not check.reduced:
            raise DidNotEnable(
                "the hook did not make the startup reading reduce over the capture "
                f"group ({check.describe()})"
            )
        self.shape = shape
        detail["shape"] = shape
        detail["repaired_reading"] = check.describe()
        via = f"{adapter.WORKER_MODULE.rpartition('.')[2]}.{adapter.MEMORY_HELPER}"
        return Hook(
            target=STARTUP_TARGET,
            owner=cls,
            attr=INIT_GRAPHS,
            around=around,
            reason=(
                "the draft CUDA-graph capture decision reads this rank's free memory "
                "only; reducing it to the capture group's minimum at startup (via "
                f"{via})"
            ),
            detail=detail,
        )

    def agreement_hook(self, why: str) -> Hook | None:
        module, cls = adapter.load_worker()  # DidNotEnable: no target anywhere
        if adapter.reads_through_spec_tp_sync(module):
            # The reading (and its agreement) is capture-group-memory's there:
            # a hook here would enter a collective no other rank enters.
            return None
        return Hook(
            target=STARTUP_TARGET,
            owner=cls,
            attr=INIT_GRAPHS,
            around=make_around(module, None, GroupVerdict(self.name, False, why)),
            reason=(
                f"{why}; hooked only to agree with the other ranks of the capture "
                "group, which then all decide from their own reading (stock)"
            ),
        )


REPAIR = StartupCaptureRepair()
