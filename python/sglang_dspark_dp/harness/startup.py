"""Startup consensus harness: do all ranks make the same draft CUDA-graph
capture decision? One process per rank, the installed SGLang code, CPU only.

The ranks join a ``torch.distributed`` gloo group over loopback and each
runs the installed ``DSparkWorkerV2.init_cuda_graphs`` on a stand-in worker
(:class:`sglang_dspark_dp.drivers.worker.WorkerStandIn`). The method, SGLang's
free-memory helper and its reduction are real; so is ``SpecTpSync`` where
the release has it, built on the group the worker builds it on. What stands
in:

- each rank's free memory (the helper's CPU branch is made to find the
  configured amount: ``psutil``'s available memory, one NUMA node, no cgroup
  cap) and the worker's platform checks (answer CUDA);
- the groups, laid out as a server lays them out and built as SGLang's own
  ``GroupCoordinator`` on gloo where the release lets it be
  (:mod:`sglang_dspark_dp.harness.groups`): ``groups`` TP groups of ``tp``
  ranks side by side (a second one's ranks start at ``tp``), attention-TP
  groups inside each under DP attention; the capture group is the TP group
  (plain TP, or DP attention with a DeepSeek-V4/MoE draft, whose graphs
  capture on the full TP group) or, for a dense draft under DP attention,
  the attention-TP group; ``SpecTpSync`` gets the attention-TP group under
  DP attention, else the TP group. Each capture group decides on its own:
  its ranks must agree, from its own minimum;
- the draft runner's capture, which records the decision and, with
  ``barrier`` on, enters a barrier on the capture group as
  ``FullCudaGraphBackend``'s capture does. A rank that skips capture never
  enters it, so the capturing ranks time out there: a detected hang.

The parent collects one report per rank; every collective has a timeout and
the parent kills whatever is left. ``fix=False`` runs stock SGLang (the
startup repairs, startup-capture and capture-group-memory, uninstrumented in
every rank), ``fix=True`` the repairs instrumented in every rank, before the
rank joins its group; with ``after_init`` the rank joins its group first and
then loads the plugin the way a server does (SGLang's ``load_plugins()``),
as an ``Engine`` built inside a job that already runs ``torch.distributed``
would. Each rank reports every repair's status.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import sys
import time
from typing import Any

from sglang_dspark_dp.harness import groups, world
from sglang_dspark_dp.harness.lockstep import CannotRun, free_port
from sglang_dspark_dp.harness.ranks import (
    check_groups,
    check_timing,
    is_int,
    is_number,
    run_ranks,
)

MAX_WORLD = 16
#: Free memory of the ranks that are not short of it (GiB).
PLENTY_GIB = 40.0
#: Free memory of the one rank that is, by default (GiB).
SHORT_GIB = 0.6

CAPTURED = "captured"
SKIPPED = "skipped"
HUNG = "hung"
ERROR = "error"

SPEC_TP_SYNC_ENV = "SGLANG_SPEC_TP_SYNC"
#: The repairs of the startup decision: by the worker module's name
#: (0.5.16-0.5.18) and at SpecTpSync (0.5.19 on).
STARTUP_REPAIRS = ("startup-capture", "capture-group-memory")

#: ``(tp, dp)`` of the topologies ``verify`` runs: plain TP 2/4/8 and DP
#: attention with attention TP 1 (the configuration of SGLang issue #39886).
STANDARD_TOPOLOGIES: tuple[tuple[int, int], ...] = ((2, 1), (4, 1), (8, 1), (4, 4))


@dataclasses.dataclass(frozen=True)
class StartupConfig:
    """One startup to run.

    ``tp`` ranks per TP group, ``groups`` TP groups side by side (world
    ``tp * groups``); ``dp > 1`` turns DP attention on (attention TP
    ``tp // dp``); ``dense_draft``: under DP attention the draft captures
    on the attention-TP group. ``free_gib``: each rank's free memory in GiB,
    one per rank of the world (None: 40 GiB everywhere but the last rank,
    which has 0.6). ``coordinator``: the groups are SGLang's
    ``GroupCoordinator`` where it can be built on gloo. ``spec_tp_sync``: a value
    for ``SGLANG_SPEC_TP_SYNC`` in the ranks (None: left as it is).
    ``hang_s``: how long a capture barrier waits for its peers before the
    run counts it as a hang. ``timeout_s``: the whole run's bound.
    """

    tp: int = 4
    dp: int = 1
    groups: int = 1
    dense_draft: bool = False
    coordinator: bool = True
    free_gib: tuple[float, ...] | None = None
    fix: bool = True
    timeout_s: float = 60.0
    hang_s: float = 3.0
    barrier: bool = True
    spec_tp_sync: str | None = None
    port: int = 0
    #: Ranks whose startup repairs' probes fail (an unexpected exception, as
    #: a transient condition would raise) while the others' succeed.
    probe_fails: tuple[int, ...] = ()
    #: Join the group first, then load the plugin through SGLang's
    #: ``load_plugins()`` (needs ``fix``).
    after_init: bool = False
    #: The consensus watch in every rank (:mod:`sglang_dspark_dp.watch`),
    #: hooked after the repairs: its mode (``exit`` or ``log``), None: off.
    watch: str | None = None
    #: With ``watch``: ranks that cannot watch (a fault injected there).
    watch_fails: tuple[int, ...] = ()

    @property
    def layout(self) -> world.Layout:
        return world.Layout(
            tp=self.tp, dp=self.dp, groups=self.groups, dense_draft=self.dense_draft
        )

    @property
    def attn_tp(self) -> int:
        return self.layout.attn_tp

    @property
    def dp_attention(self) -> bool:
        return self.layout.dp_attention

    @property
    def world(self) -> int:
        return self.layout.world

    def capture_size(self) -> int:
        """Ranks per capture group."""
        return self.layout.capture_size()

    def capture_groups(self) -> list[list[int]]:
        """The world's capture groups (each decides on its own)."""
        return self.layout.capture_groups()

    def free(self) -> tuple[float, ...]:
        """Each rank's free memory (GiB)."""
        if self.free_gib is not None:
            return tuple(float(x) for x in self.free_gib)
        if self.world == 1:
            return (SHORT_GIB,)
        return (PLENTY_GIB,) * (self.world - 1) + (SHORT_GIB,)

    def describe(self) -> str:
        text = f"TP {self.tp}"
        if self.dp_attention:
            text += f", DP attention {self.dp} (attention TP {self.attn_tp})"
            if self.dense_draft:
                text += ", dense draft"
        if self.groups > 1:
            text = f"{self.groups} groups of {text}"
        return text

    def validate(self) -> None:
        if not is_int(self.tp) or not 1 <= self.tp <= MAX_WORLD:
            raise CannotRun(
                f"tp must be an integer between 1 and {MAX_WORLD}, got {self.tp!r}"
            )
        if not is_int(self.dp) or not 1 <= self.dp <= self.tp:
            raise CannotRun(
                f"dp must be an integer between 1 and tp ({self.tp}), got {self.dp!r}"
            )
        if self.tp % self.dp:
            raise CannotRun(f"dp must divide tp (tp={self.tp}), got dp={self.dp}")
        check_groups(self, MAX_WORLD, CannotRun)
        if self.dense_draft and not self.dp_attention:
            raise CannotRun(
                f"dense_draft needs DP attention (dp > 1), got dp={self.dp!r}"
            )
        if self.free_gib is not None:
            try:
                values = tuple(self.free_gib)
            except TypeError:
                raise CannotRun(
                    f"free_gib must be one number per rank, got {self.free_gib!r}"
                ) from None
            if len(values) != self.world:
                raise CannotRun(
                    f"free_gib must have one value per rank ({self.world} ranks: "
                    f"tp={self.tp} x groups={self.groups}), got {len(values)}: "
                    f"{self.free_gib!r}"
                )
            for i, value in enumerate(values):
                if not is_number(value) or value < 0:
                    raise CannotRun(
                        f"free_gib[{i}] must be a finite number of GiB >= 0, got "
                        f"{value!r}"
                    )
        check_timing(self, CannotRun)
        for field in ("probe_fails", "watch_fails"):
            value = getattr(self, field)
            if not isinstance(value, tuple) or any(
                not is_int(r) or not 0 <= r < self.world for r in value
            ):
                raise CannotRun(
                    f"{field} must name ranks 0-{self.world - 1}, got {value!r}"
                )
        if self.after_init and (not self.fix or self.probe_fails):
            raise CannotRun(
                "after_init loads the plugin as a server does: it needs fix=True "
                f"and no probe_fails, got fix={self.fix!r}, "
                f"probe_fails={self.probe_fails!r}"
            )
        if self.watch is not None and self.watch not in ("exit", "log"):
            raise CannotRun(f"watch must be 'exit', 'log' or None, got {self.watch!r}")
        if self.spec_tp_sync is not None and not isinstance(self.spec_tp_sync, str):
            raise CannotRun(
                f"spec_tp_sync must be a string or None, got {self.spec_tp_sync!r}"
            )


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """What one rank read and decided."""

    rank: int
    dp_rank: int
    #: Its capture group's ranks (global).
    group: tuple[int, ...]
    free_gib: float  # the free memory it was given
    read_gib: float | None  # the figure its decision compared (None: none read)
    reduced: bool  # that figure was reduced over the capture group
    decision: str  # CAPTURED | SKIPPED | HUNG | ERROR
    detail: str = ""
    repair: str = ""  # the acting startup repair's outcome on this rank
    #: Its folded-sampling decision (the installed one, where the release
    #: makes it from free memory; None: not made).
    folded: bool | None = None
    #: Every repair's ``{repair, outcome, reason}`` on this rank.
    statuses: tuple[dict[str, str], ...] = ()
    #: The watch's alarm lines on this rank (``watch="log"``).
    alarms: tuple[str, ...] = ()
    #: How many of them it had logged when the draft worker was told its
    #: capture decision, before any capture barrier (None: not told).
    alarms_before_capture: int | None = None

    @property
    def finished(self) -> bool:
        return self.decision in (CAPTURED, SKIPPED)

    def describe(self) -> str:
        """``read 0.60 GiB (its own) and skipped draft capture``."""
        if self.read_gib is None:
            read = "read no free memory"
        else:
            how = "capture-group minimum" if self.reduced else "rank-local"
            read = f"read {self.read_gib:.2f} GiB ({how})"
        if self.decision == CAPTURED:
            if self.folded is not None:
                on = "with" if self.folded else "without"
                return f"{read} and captured the draft CUDA graphs {on} folded sampling"
            return f"{read} and captured the draft CUDA graphs"
        if self.decision == SKIPPED:
            return f"{read} and skipped draft CUDA-graph capture"
        if self.decision == HUNG:
            return f"{read}, entered draft capture and hung ({self.detail})"
        return f"{read} and failed ({self.detail})"


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


@dataclasses.dataclass
class StartupResult:
    config: StartupConfig
    sglang_version: str
    #: The acting startup repair's status in the ranks (``Status.as_dict()``):
    #: the one enabled, else startup-capture's.
    repair: dict[str, Any]
    ranks: tuple[RankOutcome, ...]
    seconds: float
    #: What the ranks' groups were (``GroupCoordinator``, ``PlainGroup``).
    group_kind: str = ""

    def by_group(self) -> list[list[RankOutcome]]:
        """The ranks of each capture group."""
        out: dict[tuple[int, ...], list[RankOutcome]] = {}
        for r in self.ranks:
            out.setdefault(r.group, []).append(r)
        return list(out.values())

    @staticmethod
    def _agree(ranks: list[RankOutcome]) -> bool:
        return all(r.finished for r in ranks) and (
            len({(r.decision, r.folded) for r in ranks}) == 1
        )

    def group_agrees(self, ranks: list[RankOutcome]) -> bool:
        """Whether one capture group's ranks (of :meth:`by_group`) finished
        with the same decisions."""
        return self._agree(ranks)

    @property
    def agree(self) -> bool:
        """In every capture group, every rank finished ``init_cuda_graphs``
        with the same decisions (capture, and folded sampling where it was
        decided)."""
        return all(self._agree(g) for g in self.by_group())

    @property
    def hung(self) -> bool:
        return any(r.decision == HUNG for r in self.ranks)

    @property
    def decision(self) -> str | None:
        """The ranks' common decision (None: not all the same)."""
        decisions = {(r.decision, r.folded) for r in self.ranks}
        if self.agree and len(decisions) == 1:
            return self.ranks[0].decision
        return None

    def expected_of(self, group: tuple[int, ...]) -> str:
        """What the ranks of a capture group should decide: skip if any of
        them is short."""
        free = self.config.free()
        return SKIPPED if min(free[r] for r in group) < _cutoff() else CAPTURED

    @property
    def expected(self) -> str | None:
        """What all ranks should decide (None: the groups differ)."""
        wanted = {self.expected_of(r.group) for r in self.ranks}
        return wanted.pop() if len(wanted) == 1 else None

    @property
    def correct(self) -> bool:
        return self.agree and all(
            r.decision == self.expected_of(r.group) for r in self.ranks
        )

    @property
    def divergence(self) -> str:
        """Empty when every group's ranks agree; else which ranks did what."""
        if self.agree:
            return ""
        parts = []
        for ranks in self.by_group():
            if self._agree(ranks):
                continue
            seen: dict[str, list[int]] = {}
            for r in ranks:
                seen.setdefault(r.describe(), []).append(r.rank)
            parts.extend(f"{_ranks_text(rs)} {text}" for text, rs in seen.items())
        if self.hung:
            head = "startup hang: "
        elif all(len({r.decision for r in g}) == 1 for g in self.by_group()):
            head = (
                "ranks disagree on folded sampling (a mismatched collective at "
                "the first sampling step): "
            )
        else:
            head = "ranks disagree on draft capture: "
        return head + "; ".join(parts)

    def summary(self) -> str:
        """One line for the CLI."""
        where = f"{self.config.describe()}, {'fixed' if self.config.fix else 'stock'}"
        if not self.agree:
            return f"{where}: {self.divergence}"
        return f"{where}: " + "; ".join(self._group_summary(g) for g in self.by_group())

    def _group_summary(self, ranks: list[RankOutcome]) -> str:
        r = ranks[0]
        if len(self.ranks) == 1:
            how = "one rank, nothing to reduce"
        elif all(x.reduced for x in ranks):
            how = "reduced over the capture group"
        else:
            how = "each rank its own reading"
        want = self.expected_of(r.group)
        verdict = "" if r.decision == want else f" (expected: {want})"
        if len(self.ranks) == 1:
            who = "the rank"
        elif len(ranks) == len(self.ranks):
            who = f"all {len(ranks)} ranks"
        else:
            who = f"capture group {list(r.group)}: all {len(ranks)} ranks"
        folded = (
            ""
            if r.folded is None
            else f" {'with' if r.folded else 'without'} folded sampling"
        )
        free = self.config.free()
        return (
            f"{who} {r.decision} draft CUDA graphs{folded} "
            f"({how}; min free {min(free[x] for x in r.group):.2f} GiB, cutoff "
            f"{_cutoff():.1f} GiB){verdict}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "sglang": self.sglang_version,
            "repair": dict(self.repair),
            "agree": self.agree,
            "hung": self.hung,
            "decision": self.decision,
            "expected": self.expected,
            "group_kind": self.group_kind,
            "divergence": self.divergence,
            "ranks": [dataclasses.asdict(r) for r in self.ranks],
            "seconds": round(self.seconds, 3),
        }


def _cutoff() -> float:
    from sglang_dspark_dp.adapter import CAPTURE_CUTOFF_GIB

    return CAPTURE_CUTOFF_GIB


# --------------------------------------------------------------------------
# One rank.
# --------------------------------------------------------------------------


def stand_in_worker(
    module: Any,
    cls: type,
    *,
    capture: Any,
    runner_tp: Any,
    dp_tp: Any,
    dense_draft: bool,
    on_capture: Any,
    dp_attention: bool = False,
) -> tuple[Any, Any]:
    """A stand-in worker over these groups whose draft capture calls
    ``on_capture(capture)``, and the recorder of its free-memory readings."""
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import worker as standins

    worker = standins.WorkerStandIn(
        module,
        cls,
        capture_group=capture,
        dp_tp_group=dp_tp,
        on_capture=on_capture,
        runner_group=runner_tp,
        dense_draft=dense_draft,
        dp_attention=dp_attention,
    )
    return worker, standins.RecordedReadings(
        adapter.memory_helper_sites(module, worker)
    )


def init_graphs(
    module: Any, cls: type, worker: Any, recorded: Any, free_gib: float
) -> None:
    """Run the installed ``init_cuda_graphs`` once on ``worker`` with
    ``free_gib`` of free memory and the platform taken for CUDA, its
    readings recorded; whatever the method raises propagates."""
    from sglang_dspark_dp import adapter

    with (
        adapter.pretend_cuda(module),
        adapter.injected_free_memory(free_gib),
        recorded,
    ):
        getattr(cls, adapter.INIT_GRAPHS)(worker)


def _rank_body(rank: int, cfg: StartupConfig, port: int) -> dict[str, Any]:
    if cfg.spec_tp_sync is not None:
        os.environ[SPEC_TP_SYNC_ENV] = cfg.spec_tp_sync
    return _rank_run(rank, cfg, port)


def _rank_failed(rank: int, why: str) -> dict[str, Any]:
    return {"decision": ERROR, "detail": why}


def _rank_run(rank: int, cfg: StartupConfig, port: int) -> dict[str, Any]:
    import torch

    from sglang_dspark_dp import adapter, registry

    torch.set_num_threads(1)
    module, cls = adapter.load_worker()
    # The stock warning of a rank that skips capture is the decision this
    # harness reports; keep it out of the output.
    logging.getLogger(module.__name__).setLevel(logging.ERROR)
    repairs = [registry.repair(name) for name in STARTUP_REPAIRS]
    if cfg.after_init:
        registry.uninstrument()  # whatever the parent held: a server's start
        adapter.forget_loaded_plugins()
    elif cfg.fix:
        for repair in repairs:
            if rank in cfg.probe_fails:

                def failing_probe(*args: Any, **kwargs: Any) -> Any:
                    raise RuntimeError(f"probe fault injected on rank {rank}")

                # This rank's process only.
                sys.modules[type(repair).__module__].probe = failing_probe
                repair.uninstrument()  # a fresh probe, whatever the parent held
            repair.instrument(apply=True)
    else:
        for repair in repairs:
            repair.uninstrument()
    if cfg.watch is not None:
        world.watch_on(cfg.watch, fails=rank in cfg.watch_fails)
    world.join(rank, cfg.world, port, cfg.timeout_s)
    if cfg.after_init:
        adapter.load_plugins()
    statuses = [r.status() for r in repairs]
    status = next((st for st in statuses if st.enabled), statuses[0])
    capture, runner_tp, dp_tp = world.startup_groups(
        rank, cfg.layout, hang_s=cfg.hang_s, coordinator=cfg.coordinator
    )
    told: list[bool] = []
    in_barrier: list[bool] = []

    said_before: list[int] = []

    def draft_capture(capture_decode_cuda_graph: bool) -> None:
        told.append(capture_decode_cuda_graph)
        if cfg.watch is not None:  # what the watch had said by now
            from sglang_dspark_dp import watch

            said_before.append(len(watch.alarms()))
        if capture_decode_cuda_graph and cfg.barrier:
            in_barrier.append(True)
            capture.barrier()  # as FullCudaGraphBackend's capture_one does
            in_barrier.clear()

    worker, recorded = stand_in_worker(
        module,
        cls,
        capture=capture,
        runner_tp=runner_tp,
        dp_tp=dp_tp,
        dense_draft=cfg.dense_draft,
        on_capture=draft_capture,
        dp_attention=cfg.dp_attention,
    )
    decision, detail = ERROR, ""
    try:
        init_graphs(module, cls, worker, recorded, cfg.free()[rank])
        if not told:
            detail = "init_cuda_graphs returned without a capture decision"
        else:
            decision = CAPTURED if told[-1] else SKIPPED
    except Exception as exc:
        if in_barrier:
            decision = HUNG
            detail = f"no peer reached the capture barrier within {cfg.hang_s:g} s"
        else:
            detail = f"{type(exc).__name__}: {exc}"[-500:]
    alarms = world.watch_off() if cfg.watch is not None else []
    # The capture decision's reading comes first (the folded-sampling
    # decision, where it reads its own, comes after).
    readings = recorded.readings
    reading = readings[0] if readings else None
    return {
        "decision": decision,
        "detail": detail,
        "read_gib": None if reading is None else reading.value,
        "reduced": bool(
            readings
            and capture.world_size > 1
            and all(
                r.distributed and r.cpu_group is capture.cpu_group for r in readings
            )
        ),
        "folded": worker.folded,
        "group": list(capture.ranks),
        "group_kind": groups.kind(capture),
        "status": status.as_dict(),
        "statuses": [
            {"repair": st.repair, "outcome": st.outcome.value, "reason": st.reason}
            for st in registry.status()
        ],
        "alarms": alarms,
        "alarms_before_capture": said_before[-1] if said_before else None,
    }


# --------------------------------------------------------------------------
# Parent.
# --------------------------------------------------------------------------


def run_startup(cfg: StartupConfig) -> StartupResult:
    """Run one startup; raises :class:`CannotRun` for bad input or when the
    installed SGLang has no DSpark worker to drive."""
    cfg.validate()
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version

    try:
        adapter.load_worker()  # imported here, so forked ranks start warm
    except DidNotEnable as exc:
        raise CannotRun(str(exc)) from exc
    port = free_port(cfg.port)
    start = time.monotonic()
    reports = run_ranks(
        cfg.world,
        functools.partial(_rank_body, cfg=cfg, port=port),
        _rank_failed,
        timeout_s=cfg.timeout_s,
    )
    free = cfg.free()
    capture_groups = cfg.capture_groups()
    ranks = []
    for r in range(cfg.world):
        report = reports.get(r)
        if report is None:
            report = {
                "decision": HUNG,
                "detail": f"no report within {cfg.timeout_s:g} s (killed)",
            }
        ranks.append(
            RankOutcome(
                rank=r,
                dp_rank=cfg.layout.dp_rank(r),
                group=tuple(groups.group_of(capture_groups, r)),
                free_gib=free[r],
                read_gib=report.get("read_gib"),
                reduced=bool(report.get("reduced", False)),
                decision=report["decision"],
                detail=report.get("detail", ""),
                repair=report.get("status", {}).get("outcome", ""),
                folded=report.get("folded"),
                statuses=tuple(report.get("statuses", ())),
                alarms=tuple(report.get("alarms", ())),
                alarms_before_capture=report.get("alarms_before_capture"),
            )
        )
    status = next(
        (rep["status"] for _, rep in sorted(reports.items()) if "status" in rep), {}
    )
    kinds = {rep.get("group_kind") for rep in reports.values() if rep.get("group_kind")}
    return StartupResult(
        config=cfg,
        sglang_version=installed_sglang_version() or "unknown",
        repair=status,
        ranks=tuple(ranks),
        seconds=time.monotonic() - start,
        group_kind=", ".join(sorted(kinds)),
    )


def run_matrix(
    *,
    fix: bool = True,
    topologies: tuple[tuple[int, int], ...] = STANDARD_TOPOLOGIES,
    **config: Any,
) -> list[StartupResult]:
    """:func:`run_startup` for each ``(tp, dp)`` (default free memory: one
    rank short); ``config`` goes to every :class:`StartupConfig`."""
    return [
        run_startup(StartupConfig(tp=tp, dp=dp, fix=fix, **config))
        for tp, dp in topologies
    ]
