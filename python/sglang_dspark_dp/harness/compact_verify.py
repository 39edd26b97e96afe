"""Compact-verify harness: do all TP ranks pick the same verify graph tier
and all enter the ``verify_lens`` broadcast? One process per rank, the
installed DSpark verify planner, CPU only.

The ranks join a ``torch.distributed`` gloo group over loopback, cut into
``groups`` TP groups of ``tp`` ranks side by side (``[0, 1]`` and ``[2, 3]``:
the TP groups of two pipeline stages, say), each SGLang's own
``GroupCoordinator`` on gloo where the release lets it be built that way
(:mod:`sglang_dspark_dp.harness.groups`); every group runs the scenario on
its own. Each rank builds the installed ``DSparkVerifyPlanner`` by its own
constructor, with
its real ``HostConfidenceBudgetPlanner``, a profiled SPS table loaded from
a file by SGLang's loader, its real top-k verify-length schedule and layout,
and (overlap path) the real ``ConfidenceRelay``. What stands in
(:mod:`sglang_dspark_dp.drivers.planner`): the model runner (a request pool
and a decode CUDA-graph runner that captured ragged-verify tiers), the draft
model (it has a confidence head; the confidences are given), the runtime
settings, the relay's CUDA events and stream, and the decode batch.

Two scenarios:

- ``drift`` (non-overlap path: ``resolve_verify_token_budget`` ->
  ``compute_budget_sync`` -> ``schedule_layout``): at every step all ranks
  share draft confidences set near a tie between two graph tiers (found with
  the installed budget planner itself), and each rank adds its own noise of
  ``noise`` (TP ranks' confidence heads differ by rounding);
- ``late`` (overlap path: ``prepare_verify_budget`` -> ``schedule_layout``,
  the relay published after each step): identical confidences everywhere,
  but ``late_rank``'s lagged device-to-host copy has not landed every
  ``late_every``-th step, so its relay resolves None.

The ``verify_lens`` broadcast is checked before it runs: every rank that
reaches it tells its group's referee (a second gloo group over the same
ranks, which each enters exactly once per step and once per broadcast);
only when every rank of the group is there does the real broadcast run. A rank left out is reported instead of left to
hang (in a server the others would wait in it, or pair it with the next
step's collective). The budget broadcast the repair adds runs on the TP
group unchecked: if it were ever unbalanced the group's timeout (``hang_s``)
would show it as a rank error.

The parent collects every rank's per-step record; every collective has a
timeout and the parent kills whatever is left. ``fix=False`` runs stock
SGLang (the verify-budget and relay-wait repairs uninstrumented in every
rank), ``fix=True`` the repairs named in ``repairs`` (default both)
instrumented in every rank with ``instrument(apply=True)``.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import os
import tempfile
import time
import traceback
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

MAX_WORLD = 8
DRIFT = "drift"
LATE = "late"
SCENARIOS = (DRIFT, LATE)
MODES = ("compact", "cap-accept")
#: The repairs of the verify path: the budget (drift) and the relay (late).
VERIFY_REPAIRS = ("verify-budget", "relay-wait")

#: The verify broadcast as the referee saw it at one step.
ALL_IN = "all"  # every rank entered it
NONE_IN = "none"  # no rank did (no budget anywhere: uniform layout)
LEFT_OUT = "left-out"  # some ranks entered it, others never came

_BCAST, _END = 1, 2


@dataclasses.dataclass(frozen=True)
class CompactConfig:
    """One run.

    ``tp`` ranks (plain TP) run ``steps`` decode steps of ``bs`` requests
    drafting ``gamma`` tokens each (verify window ``gamma + 1``; graphs are
    captured at every multiple of ``bs`` tokens up to the full window).
    ``scenario``: ``drift`` or ``late`` (see the module). ``mode``: the
    ragged-verify mode (``compact``; ``cap-accept`` also schedules a budget
    and broadcasts ``verify_lens``, but picks no graph tier from it).
    ``groups`` TP groups of ``tp`` ranks each run side by side (world
    ``tp * groups``); ``coordinator``: on SGLang's ``GroupCoordinator``
    where the release lets it be built on gloo.
    """

    scenario: str = DRIFT
    tp: int = 2
    groups: int = 1
    coordinator: bool = True
    steps: int = 40
    fix: bool = True
    seed: int = 0
    bs: int = 16
    gamma: int = 7
    mode: str = "compact"
    #: drift: each rank's confidences differ from the shared ones by up to
    #: this much.
    noise: float = 2e-3
    #: late: whose relay copy is late (its rank within each group), and how
    #: often (every k-th step, counted from the first step the relay can
    #: resolve).
    late_rank: int = 1
    late_every: int = 7
    timeout_s: float = 60.0
    hang_s: float = 3.0
    port: int = 0
    #: Ranks whose verify-budget probe fails (an unexpected exception, as a
    #: transient condition would raise) while the others' succeed.
    probe_fails: tuple[int, ...] = ()
    #: With ``fix``: the repairs instrumented (of :data:`VERIFY_REPAIRS`).
    repairs: tuple[str, ...] = VERIFY_REPAIRS
    #: The consensus watch in every rank (:mod:`sglang_dspark_dp.watch`),
    #: hooked after the repairs: its mode (``exit`` or ``log``), None: off.
    watch: str | None = None
    #: Test-only: ``(rank, step)``: that rank (of the world) hands
    #: ``schedule_layout`` a budget one more than it resolved at that step,
    #: an input of a watched decision perturbed on one rank (None: never).
    skew_budget: tuple[int, int] | None = None
    #: SGLang's own rank consensus checker (0.5.19+) configured in every
    #: rank on its TP group (SGLang's ``GroupCoordinator``), as the
    #: scheduler configures it; needs ``watch`` (its switch) and
    #: ``coordinator``. Its log lines come back in ``CompactResult.checker``.
    sglang_checker: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.groups

    @property
    def verify_tokens(self) -> int:
        return self.gamma + 1

    @property
    def capture_num_tokens(self) -> list[int]:
        return [self.bs * k for k in range(1, self.verify_tokens + 1)]

    @property
    def overlap(self) -> bool:
        return self.scenario == LATE

    def describe(self) -> str:
        what = (
            f"confidence drift {self.noise:g}"
            if self.scenario == DRIFT
            else f"rank {self.late_rank} late every {self.late_every} steps"
        )
        where = (
            f"TP {self.tp}"
            if self.groups == 1
            else (f"{self.groups} TP groups of {self.tp}")
        )
        return f"{where}, {self.mode}, {what}"

    def validate(self) -> None:
        if self.scenario not in SCENARIOS:
            raise CannotRun(
                f"scenario must be one of {', '.join(SCENARIOS)}, got {self.scenario!r}"
            )
        if self.mode not in MODES:
            raise CannotRun(
                f"mode must be one of {', '.join(MODES)}, got {self.mode!r}"
            )
        if not is_int(self.tp) or not 2 <= self.tp <= MAX_WORLD:
            raise CannotRun(
                f"tp must be an integer between 2 and {MAX_WORLD}, got {self.tp!r}"
            )
        check_groups(self, MAX_WORLD, CannotRun)
        for field, low, high in (
            ("steps", 1, 10_000),
            ("bs", 1, 256),
            ("gamma", 1, 16),
            ("late_every", 1, 10_000),
        ):
            value = getattr(self, field)
            if not is_int(value) or not low <= value <= high:
                raise CannotRun(
                    f"{field} must be an integer between {low} and {high}, got "
                    f"{value!r}"
                )
        if not is_int(self.seed) or self.seed < 0:
            raise CannotRun(f"seed must be an integer >= 0, got {self.seed!r}")
        if not is_number(self.noise) or not 0 <= self.noise < 0.5:
            raise CannotRun(f"noise must be a number in [0, 0.5), got {self.noise!r}")
        if not is_int(self.late_rank) or not 0 <= self.late_rank < self.tp:
            raise CannotRun(
                f"late_rank must name a rank 0-{self.tp - 1}, got {self.late_rank!r}"
            )
        check_timing(self, CannotRun)
        try:
            fails = tuple(self.probe_fails)
        except TypeError:
            raise CannotRun(
                f"probe_fails must be a tuple of ranks, got {self.probe_fails!r}"
            ) from None
        if any(not is_int(r) or not 0 <= r < self.world for r in fails):
            raise CannotRun(
                f"probe_fails must name ranks 0-{self.world - 1}, got "
                f"{self.probe_fails!r}"
            )
        skew = self.skew_budget
        if skew is not None and not (
            isinstance(skew, tuple)
            and len(skew) == 2
            and is_int(skew[0])
            and 0 <= skew[0] < self.world
            and is_int(skew[1])
            and 0 <= skew[1] < self.steps
        ):
            raise CannotRun(
                f"skew_budget must be (rank 0-{self.world - 1}, step "
                f"0-{self.steps - 1}) or None, got {skew!r}"
            )
        if self.watch is not None and self.watch not in ("exit", "log"):
            raise CannotRun(f"watch must be 'exit', 'log' or None, got {self.watch!r}")
        if self.sglang_checker not in (True, False):
            raise CannotRun(
                f"sglang_checker must be True or False, got {self.sglang_checker!r}"
            )
        if self.sglang_checker and (self.watch is None or not self.coordinator):
            raise CannotRun(
                "sglang_checker needs watch (SGLang's switch turns both on) and "
                f"coordinator (its groups), got watch={self.watch!r}, "
                f"coordinator={self.coordinator!r}"
            )
        if isinstance(self.repairs, str) or any(
            r not in VERIFY_REPAIRS for r in self.repairs
        ):
            raise CannotRun(
                f"repairs must name repairs of {', '.join(VERIFY_REPAIRS)}, got "
                f"{self.repairs!r}"
            )


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What every rank did at one step."""

    step: int
    #: The group's ranks (global), in order; each tuple below follows them.
    ranks: tuple[int, ...]
    budgets: tuple[int | None, ...]
    tiers: tuple[int | None, ...]  # graph_num_tokens (None: no compact layout)
    in_broadcast: tuple[bool, ...]  # entered the verify_lens broadcast
    late: tuple[bool, ...]  # this rank's relay copy was late

    @property
    def same_tier(self) -> bool:
        return len(set(self.tiers)) == 1

    @property
    def broadcast(self) -> str:
        if all(self.in_broadcast):
            return ALL_IN
        if not any(self.in_broadcast):
            return NONE_IN
        return LEFT_OUT

    @property
    def agree(self) -> bool:
        return self.same_tier and self.broadcast != LEFT_OUT

    def tier_text(self) -> str:
        return "graph tiers " + ", ".join(
            f"rank {r}: {t} (budget {b})"
            for r, t, b in zip(self.ranks, self.tiers, self.budgets, strict=True)
        )

    def broadcast_text(self) -> str:
        ins = [r for r, x in zip(self.ranks, self.in_broadcast, strict=True) if x]
        outs = [r for r, x in zip(self.ranks, self.in_broadcast, strict=True) if not x]
        late = [r for r, x in zip(self.ranks, self.late, strict=True) if x]
        why = f"; late: {_ranks(late)}" if late else ""
        return (
            f"only {_ranks(ins)} entered the verify_lens broadcast "
            f"({_ranks(outs)} never came{why})"
        )

    def describe(self) -> str:
        parts = []
        if not self.same_tier:
            parts.append(self.tier_text())
        if self.broadcast == LEFT_OUT:
            parts.append(self.broadcast_text())
        return f"step {self.step}: " + ("; ".join(parts) or "agree")


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


@dataclasses.dataclass
class CompactResult:
    config: CompactConfig
    sglang_version: str
    #: The verify-budget repair's status in each rank (``Status.as_dict()``).
    repairs: tuple[dict[str, Any], ...]
    #: What the ranks' TP groups were (``GroupCoordinator``, ``PlainGroup``).
    group_kind: str
    steps: tuple[StepOutcome, ...]
    #: Rank -> what went wrong there (an exception, a timeout, a dead rank).
    errors: dict[int, str]
    seconds: float
    #: Rank -> the watch's alarm lines there (``watch="log"``).
    alarms: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: Rank -> SGLang's checker's log lines there (``sglang_checker``), kept
    #: on disk as it logs them: it ends the process on a divergence.
    checker: dict[int, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return not self.errors and (
            len(self.steps) == self.config.steps * self.config.groups
        )

    @property
    def diverged(self) -> list[StepOutcome]:
        """Steps whose ranks chose different graph tiers."""
        return [s for s in self.steps if not s.same_tier]

    @property
    def left_out(self) -> list[StepOutcome]:
        """Steps where some ranks entered the verify_lens broadcast and
        others did not."""
        return [s for s in self.steps if s.broadcast == LEFT_OUT]

    @property
    def late_steps(self) -> list[StepOutcome]:
        return [s for s in self.steps if any(s.late)]

    @property
    def agree(self) -> bool:
        """Every step ran on every rank, with one tier and the broadcast
        entered by all ranks or by none."""
        return self.complete and all(s.agree for s in self.steps)

    @property
    def repair(self) -> dict[str, Any]:
        return self.repairs[0] if self.repairs else {}

    def summary(self) -> str:
        """One line for the CLI."""
        where = f"{self.config.describe()}, {'fixed' if self.config.fix else 'stock'}"
        n = len(self.steps)
        if self.errors:
            first = min(self.errors)
            return (
                f"{where}: failed after {n // self.config.groups} steps (rank {first}: "
                f"{self.errors[first].splitlines()[-1][:200]})"
            )
        if self.agree:
            tiers = sorted({t for s in self.steps for t in s.tiers if t is not None})
            # Counted per group and step (each group broadcasts on its own).
            ins = sum(s.broadcast == ALL_IN for s in self.steps)
            who = f"all {self.config.tp} ranks"
            unit = "steps"
            if self.config.groups > 1:
                who += f" of each of {self.config.groups} groups"
                unit = "group steps"
            return (
                f"{where}: {who} agreed at every one of {n // self.config.groups} "
                f"steps (graph tiers used: {tiers}; verify_lens broadcast entered "
                f"by all ranks at {ins} of {n} {unit}, by none at {n - ins})"
            )
        bits = []
        if self.diverged:
            first = self.diverged[0]
            bits.append(
                f"graph tiers diverged at {len(self.diverged)} of {n} steps "
                f"(first: step {first.step}: {first.tier_text()})"
            )
        if self.left_out:
            late = sum(1 for s in self.left_out if any(s.late))
            scope = (
                f", {late} of {len(self.late_steps)} late steps"
                if self.late_steps
                else ""
            )
            first = self.left_out[0]
            bits.append(
                f"a rank was left out of the verify_lens broadcast at "
                f"{len(self.left_out)} steps{scope} (first: step {first.step}: "
                f"{first.broadcast_text()})"
            )
        return f"{where}: " + "; ".join(bits)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": dataclasses.asdict(self.config),
            "sglang": self.sglang_version,
            "repair": dict(self.repair),
            "agree": self.agree,
            "diverged_steps": [s.step for s in self.diverged],
            "left_out_steps": [s.step for s in self.left_out],
            "late_steps": [s.step for s in self.late_steps],
            "errors": {str(k): v for k, v in self.errors.items()},
            "steps": [
                dict(dataclasses.asdict(s), broadcast=s.broadcast) for s in self.steps
            ],
            "summary": self.summary(),
            "seconds": round(self.seconds, 3),
        }


# --------------------------------------------------------------------------
# One rank.
# --------------------------------------------------------------------------


class _Referee:
    """Tells every rank where the others are before a ``verify_lens``
    broadcast and at the end of each step (one small all-gather over its
    own gloo group)."""

    def __init__(self, pg: Any, world: int) -> None:
        self.pg = pg
        self.world = world

    def where(self, kind: int, step: int) -> list[tuple[int, int]]:
        import torch
        import torch.distributed as dist

        mine = torch.tensor([kind, step], dtype=torch.int64)
        out = torch.empty((self.world * 2,), dtype=torch.int64)
        dist.all_gather_into_tensor(out, mine, group=self.pg)
        flat = out.tolist()
        return [(int(flat[i]), int(flat[i + 1])) for i in range(0, len(flat), 2)]

    def end_step(self, step: int) -> None:
        """Leave the step; while other ranks are still in a broadcast this
        rank skipped, answer them until all are at the end."""
        while True:
            seen = self.where(_END, step)
            if all(kind == _END for kind, _ in seen):
                return


class _TPGroup:
    """The rank's TP group (SGLang's ``GroupCoordinator``, or a plain one)
    as the planner sees it: everything is the group's own, except that its
    ``broadcast`` asks the referee first whether every rank of the group
    is there."""

    def __init__(self, group: Any, referee: _Referee):
        self._group = group
        self._referee = referee
        self.step = -1
        self.entered = False
        self.outcome = NONE_IN

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        self.entered = True
        seen = self._referee.where(_BCAST, self.step)
        if all(s == (_BCAST, self.step) for s in seen):
            self._group.broadcast(tensor, src=src)
            self.outcome = ALL_IN
        else:
            # Others never come: a server would hang here, or pair this with
            # their next collective. Reported instead.
            self.outcome = LEFT_OUT
        return tensor

    def __repr__(self) -> str:
        return f"_TPGroup({self._group!r})"


def _rank_body(rank: int, cfg: CompactConfig, port: int, sps_path: str):
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = cfg.mode
    records: list[dict[str, Any]] = []
    status: dict[str, Any] = {}
    error = ""
    try:
        _rank_run(rank, cfg, port, sps_path, records, status)
    except Exception as exc:  # keep the steps recorded before it
        error = "".join(traceback.format_exception(exc))[-2000:]
    if cfg.sglang_checker:
        world.sglang_checker_off()
    alarms = world.watch_off() if cfg.watch is not None else []
    return {"records": records, "status": status, "error": error, "alarms": alarms}


def _rank_failed(rank: int, why: str) -> dict[str, Any]:
    return {"records": [], "status": {}, "error": why}


def _rank_run(
    rank: int,
    cfg: CompactConfig,
    port: int,
    sps_path: str,
    records: list[dict[str, Any]],
    status: dict[str, Any],
) -> None:
    import torch
    import torch.distributed as dist

    from sglang_dspark_dp import registry
    from sglang_dspark_dp.adapter import planner as sg_planner
    from sglang_dspark_dp.srt.speculative.dspark_components import (
        dspark_planner as budget_repair,
    )

    torch.set_num_threads(1)
    module, cls = sg_planner.load_planner()
    repair = budget_repair.REPAIR
    # Whatever the parent had, each rank starts as a server process does:
    # nothing hooked, then (fixed) its own probes.
    for name in VERIFY_REPAIRS:
        registry.repair(name).uninstrument()
    if cfg.fix:
        if rank in cfg.probe_fails:

            def failing_probe(*args: Any, **kwargs: Any) -> Any:
                raise RuntimeError(f"probe fault injected on rank {rank}")

            budget_repair.probe = failing_probe  # this rank's process only
        for name in cfg.repairs:
            registry.repair(name).instrument(apply=True)
    status.update(repair.status().as_dict())
    if cfg.watch is not None:
        world.watch_on(cfg.watch)

    world.join(rank, cfg.world, port, cfg.timeout_s)
    tp_layout = groups.partition(cfg.world, cfg.tp)
    base, index = world.verify_group(
        rank,
        world.Layout(tp=cfg.tp, groups=cfg.groups),
        hang_s=cfg.hang_s,
        coordinator=cfg.coordinator,
    )
    referee_groups = [
        dist.new_group(r, timeout=datetime.timedelta(seconds=cfg.timeout_s))
        for r in tp_layout
    ]
    referee = _Referee(referee_groups[index], cfg.tp)
    if cfg.sglang_checker:
        world.sglang_checker_on([base], checker_log(sps_path, rank))
    group = _TPGroup(base, referee)
    status["group_kind"] = groups.kind(base)
    in_group = group.rank_in_group
    with VerifyRank(
        module,
        cls,
        group=group,
        tp=cfg.tp,
        bs=cfg.bs,
        gamma=cfg.gamma,
        overlap=cfg.overlap,
        sps_path=sps_path,
        drift=cfg.scenario == DRIFT,
    ) as verifier:
        shared = torch.Generator().manual_seed(cfg.seed + 7919 * index)
        own = torch.Generator().manual_seed(cfg.seed * 1000 + rank + 1)
        for step in range(cfg.steps):
            shape = torch.rand((cfg.bs, cfg.gamma), generator=shared) * 0.6 + 0.4
            group.step, group.entered, group.outcome = step, False, NONE_IN
            if cfg.scenario == DRIFT:
                base = verifier.near_tie(shape)
                noise = torch.rand((cfg.bs, cfg.gamma), generator=own) * 2 - 1
                confidence = (base + noise * cfg.noise).clamp(0.0, 1.0)
                late = False
            else:
                confidence = shape
                late = in_group == cfg.late_rank and (
                    step >= verifier.lag
                    and (step - verifier.lag) % cfg.late_every == cfg.late_every - 1
                )
            skew = 1 if cfg.skew_budget == (rank, step) else 0
            budget, tier = verifier.step(confidence, late=late, skew=skew)
            records.append(
                {
                    "step": step,
                    "budget": budget,
                    "tier": tier,
                    "entered": group.entered,
                    "late": late,
                }
            )
            referee.end_step(step)


class VerifyRank:
    """One rank's installed ``DSparkVerifyPlanner`` over ``group`` (its TP
    group), built by its own constructor with the stand-ins of
    :mod:`sglang_dspark_dp.drivers.planner` and SGLang's runtime swapped in
    while the context is open: the non-overlap path (``drift``: with a
    one-rank planner whose budget is stock, to find near-ties) or the
    overlap path through the real ``ConfidenceRelay`` (a copy that has not
    landed when a step is ``late``)."""

    def __init__(
        self,
        module: Any,
        cls: type,
        *,
        group: Any,
        tp: int,
        bs: int,
        gamma: int,
        overlap: bool,
        sps_path: str,
        drift: bool = False,
    ) -> None:
        import torch

        self.module, self.cls, self.group = module, cls, group
        self.tp, self.bs, self.gamma, self.overlap = tp, bs, gamma, overlap
        self.sps_path, self.drift = sps_path, drift
        self.verify_tokens = gamma + 1
        self.capture_num_tokens = [bs * k for k in range(1, self.verify_tokens + 1)]
        self.rows = torch.arange(1, bs + 1, dtype=torch.int64)
        self.prefix = torch.full((bs,), 64, dtype=torch.int64)
        self.late_now = False
        self.lag = 0
        self._swaps: Any = None

    def _runner(self) -> Any:
        from sglang_dspark_dp.drivers import planner as standins

        r = standins.model_runner(
            req_pool_size=self.bs + 1,
            capture_num_tokens=self.capture_num_tokens,
            max_bs=self.bs,
        )
        r.req_to_token_pool.req_generation[self.rows] = 1
        return r

    def __enter__(self) -> VerifyRank:
        from sglang_dspark_dp.adapter import planner as sg_planner
        from sglang_dspark_dp.drivers import planner as standins

        module, cls = self.module, self.cls
        rt = standins.runtime(
            tp_size=self.tp,
            disable_overlap_schedule=not self.overlap,
            sps_table_path=self.sps_path,
        )
        self._swaps = sg_planner.runtime_swaps(module, runtime=rt, group=self.group)
        self._swaps.__enter__()
        try:
            self.planner = sg_planner.build_planner(
                module,
                cls,
                draft_model=standins.draft_model(),
                model_runner=self._runner(),
                runtime=rt,
                group=self.group,
                gamma=self.gamma,
                verify_num_draft_tokens=self.verify_tokens,
                tp_rank=self.group.rank_in_group,
            )
            self.oracle = None
            if self.drift:
                one = standins.runtime(
                    tp_size=1,
                    disable_overlap_schedule=False,
                    sps_table_path=self.sps_path,
                )
                with sg_planner.runtime_swaps(
                    module, runtime=one, group=standins.ReplayGroup(1)
                ):
                    self.oracle = sg_planner.build_planner(
                        module,
                        cls,
                        draft_model=standins.draft_model(),
                        model_runner=self._runner(),
                        runtime=one,
                        group=standins.ReplayGroup(1),
                        gamma=self.gamma,
                        verify_num_draft_tokens=self.verify_tokens,
                    )
            self.future_map = None
            if self.overlap:
                self.lag, depth = sg_planner.relay_lag_steps()
                events = [
                    standins.CopyEvent(landed=lambda: not self.late_now)
                    for _ in range(depth)
                ]
                relay = sg_planner.relay_on_cpu(
                    pool=self.planner.model_runner.req_to_token_pool,
                    req_pool_size=self.bs + 1,
                    gamma=self.gamma,
                    events=events,
                )
                self.future_map = standins.FutureMapStandIn(
                    relay, standins.CopyStream(), publish_ready=object()
                )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._swaps is not None:
            swaps, self._swaps = self._swaps, None
            swaps.__exit__(*exc)

    def tier_of(self, budget: Any) -> int | None:
        from sglang_dspark_dp.adapter import planner as sg_planner

        return sg_planner.graph_tier(
            self.module,
            bs=self.bs,
            budget=budget,
            verify_num_draft_tokens=self.verify_tokens,
            capture_num_tokens=self.capture_num_tokens,
        )

    def near_tie(self, shape: Any) -> Any:
        """Confidences ``scale * shape`` with ``scale`` bisected to the edge
        between two graph tiers of the installed budget planner (the
        one-rank planner, its budget method stock)."""
        from sglang_dspark_dp.adapter import planner as sg_planner

        oracle = self.oracle

        def tier(scale: float) -> int | None:
            budget = oracle.compute_budget_sync(
                confidence=(shape * scale).clamp(0.0, 1.0),
                prefix_lens=self.prefix,
                req_pool_indices=self.rows,
            )
            return self.tier_of(budget)

        with sg_planner.bind_budget(oracle, sg_planner.stock_budget(self.cls)):
            lo, hi = 0.3, 1.0
            t_lo, t_hi = tier(lo), tier(hi)
            if t_lo == t_hi:
                return shape * hi
            for _ in range(24):
                mid = (lo + hi) / 2
                if tier(mid) == t_lo:
                    lo = mid
                else:
                    hi = mid
        return shape * ((lo + hi) / 2)

    def step(
        self, confidence: Any, *, late: bool = False, skew: int = 0
    ) -> tuple[Any, int | None]:
        """One decode step's budget and graph tier (None: no compact
        layout). On the overlap path the budget is prepared from the relay
        (``late``: this rank's copy has not landed) and the confidences are
        published after the step. ``skew`` (test-only) is added to the
        budget handed to ``schedule_layout``."""
        import torch

        from sglang_dspark_dp.drivers import planner as standins

        draft_input = standins.decode_batch(req_pool_indices=self.rows).spec_info
        self.late_now = bool(late) if self.overlap else False
        if self.overlap:
            batch = standins.decode_batch(req_pool_indices=self.rows)
            draft_input = batch.spec_info
            self.planner.prepare_verify_budget(batch, self.future_map)
        budget = self.planner.resolve_verify_token_budget(
            draft_input=draft_input,
            confidence=confidence,
            prefix_lens=self.prefix,
            req_pool_indices=self.rows,
        )
        if skew and budget is not None:
            budget = budget + skew
        layout = self.planner.schedule_layout(
            req_pool_indices=self.rows,
            prefix_lens=self.prefix,
            device=torch.device("cpu"),
            confidence=confidence,
            budget=budget,
        )
        if self.future_map is not None:
            self.future_map.publish(self.rows, confidence)
        return budget, None if layout is None else int(layout.graph_num_tokens)


# --------------------------------------------------------------------------
# Parent.
# --------------------------------------------------------------------------


def write_sps_table(cfg: CompactConfig) -> str:
    """A profiled SPS table (steps per second falling with batch tokens,
    one probe per captured tier) in a file, as ``--speculative-dspark-sps-
    table-path`` names one."""
    from sglang_dspark_dp.adapter import planner as sg_planner

    tiers = cfg.capture_num_tokens
    rates = [
        100.0 * (1.0 - 0.5 * i / max(len(tiers) - 1, 1)) for i in range(len(tiers))
    ]
    table = sg_planner.profiled_sps_table(
        list(zip(tiers, rates, strict=False)), max_batch_tokens=tiers[-1]
    )
    fd, path = tempfile.mkstemp(prefix="dspark-sps-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        f.write(sg_planner.sps_table_json(table))
    return path


def checker_log(sps_path: str, rank: int) -> str:
    """Where rank ``rank`` keeps SGLang's checker's lines (next to the
    run's SPS table)."""
    return f"{sps_path}.checker-rank{rank}.log"


def _read_lines(path: str) -> tuple[str, ...]:
    try:
        with open(path, encoding="utf-8") as f:
            return tuple(line.rstrip("\n") for line in f)
    except OSError:
        return ()
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def run_compact_verify(cfg: CompactConfig) -> CompactResult:
    """Run one scenario; raises :class:`CannotRun` for bad input or when the
    installed SGLang has no DSpark verify planner to drive."""
    cfg.validate()
    from sglang_dspark_dp.adapter import planner as sg_planner
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version

    try:
        sg_planner.load_planner()  # imported here, so forked ranks start warm
        from sglang_dspark_dp.drivers import planner as _standins  # noqa: F401
        from sglang_dspark_dp.srt.managers import (  # noqa: F401
            overlap_utils as _relay_repair,
        )
        from sglang_dspark_dp.srt.speculative.dspark_components import (  # noqa: F401
            dspark_planner as _repair,
        )
    except DidNotEnable as exc:
        raise CannotRun(str(exc)) from exc
    if cfg.sglang_checker:
        from sglang_dspark_dp.adapter import checker

        try:
            checker.load()
        except ImportError as exc:
            raise CannotRun(
                f"this SGLang has no rank consensus checker (0.5.19+): {exc}"
            ) from exc
    port = free_port(cfg.port)
    sps_path = write_sps_table(cfg)
    start = time.monotonic()
    try:
        reports = run_ranks(
            cfg.world,
            functools.partial(_rank_body, cfg=cfg, port=port, sps_path=sps_path),
            _rank_failed,
            timeout_s=cfg.timeout_s,
        )
    finally:
        try:
            os.unlink(sps_path)
        except OSError:
            pass
    checker = (
        {r: _read_lines(checker_log(sps_path, r)) for r in range(cfg.world)}
        if cfg.sglang_checker
        else {}
    )
    errors: dict[int, str] = {}
    for r in range(cfg.world):
        report = reports.get(r)
        if report is None:
            errors[r] = f"no report within {cfg.timeout_s:g} s (killed)"
        elif report["error"]:
            errors[r] = report["error"]
    by_rank = [
        {rec["step"]: rec for rec in reports.get(r, {}).get("records", [])}
        for r in range(cfg.world)
    ]
    steps = []
    for ranks in groups.partition(cfg.world, cfg.tp):
        for step in range(cfg.steps):
            recs = [by_rank[r].get(step) for r in ranks]
            if any(rec is None for rec in recs):
                break
            steps.append(
                StepOutcome(
                    step=step,
                    ranks=tuple(ranks),
                    budgets=tuple(rec["budget"] for rec in recs),
                    tiers=tuple(rec["tier"] for rec in recs),
                    in_broadcast=tuple(bool(rec["entered"]) for rec in recs),
                    late=tuple(bool(rec["late"]) for rec in recs),
                )
            )
    statuses = [reports.get(r, {}).get("status", {}) for r in range(cfg.world)]
    kinds = {st.get("group_kind") for st in statuses if st.get("group_kind")}
    return CompactResult(
        config=cfg,
        sglang_version=installed_sglang_version() or "unknown",
        repairs=tuple(
            {k: v for k, v in st.items() if k != "group_kind"} for st in statuses
        ),
        group_kind=", ".join(sorted(kinds)) or "unknown",
        steps=tuple(steps),
        errors=errors,
        seconds=time.monotonic() - start,
        alarms={
            r: tuple(reports.get(r, {}).get("alarms", ())) for r in range(cfg.world)
        },
        checker=checker,
    )


def run_scenarios(
    *, fix: bool = True, scenarios: tuple[str, ...] = SCENARIOS, **config: Any
) -> list[CompactResult]:
    """:func:`run_compact_verify` for each scenario; ``config`` goes to
    every :class:`CompactConfig`."""
    return [
        run_compact_verify(CompactConfig(scenario=s, fix=fix, **config))
        for s in scenarios
    ]
