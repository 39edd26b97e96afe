"""Divergence finder: seeded per-rank perturbations drive the installed
DSpark code on simulated ranks, PyTorch's flight recorder records every
collective each rank enters, and the first place two ranks part is named
with its DSpark decision site and the upstream change it belongs to.

One run (:func:`run`) plays a :class:`Schedule` on ``world`` ranks (one
process each, gloo over loopback, the groups laid out as a server lays them
out by :mod:`sglang_dspark_dp.harness.world`):

* ``dp`` layout: DP attention over every rank (attention TP 1, EP over the
  world, a MoE draft capturing on the TP group: SGLang issue #39886's
  configuration); ``tp`` layout: plain TP, two TP groups side by side from
  4 ranks;
* the startup: the installed ``DSparkWorkerV2.init_cuda_graphs`` on the
  startup harness's stand-in worker, with each rank's own free memory (the
  capture decision; the folded-sampling decision where the release makes
  one);
* every decode step: the scheduler's per-step sync (an all-gather of each
  rank's request count over the world), the non-overlap entry
  (``Scheduler.run_batch`` with the overlap schedule off), the draft batch
  (the real ``DraftBlockProposer`` and ``can_run_graph``, ``dp`` layout)
  and compact verify (the real ``DSparkVerifyPlanner``: budget, the
  ``verify_lens`` broadcast it enters itself, the graph tier; ``tp``
  layout, with a profiled SPS table and, under overlap, the real
  ``ConfidenceRelay``).

SGLang's own collectives (``SpecTpSync``'s reductions, the ``verify_lens``
broadcast, the plugin's) run as they are. Where a decision's consequence is
a collective of the model that the stand-ins do not run, the rank enters the
one that decision makes it enter (functions named ``_enter_*``, so the
recorder's stack names them): the capture barrier of a rank that captures
draft graphs, a first sampling step that differs with folded sampling, the
draft forward's DP gather sized by the padded token count, the target
verify forward sized by the verify graph tier. Every collective has the
group's timeout (``hang_s``): a rank left waiting fails there, dumps its
recorder and reports; nothing hangs.

The perturbations are the schedule's: each rank's free memory around the
capture cutoff, confidence noise, a lagged confidence copy not yet landed,
idle ranks (requests arrive and finish), the overlap schedule on or off.
:func:`search` has ``hypothesis`` generate schedules and shrink one that
diverges to the smallest that still does; :func:`discover` repeats it,
masking each finding's site, until no new one appears.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import random
import shutil
import tempfile
import time
import traceback
from typing import Any

from sglang_dspark_dp.harness import flight, world
from sglang_dspark_dp.harness.lockstep import CannotRun, free_port
from sglang_dspark_dp.harness.ranks import is_int, run_ranks

LAYOUTS = ("dp", "tp")
WORLDS = (2, 4, 8)
#: The code paths a schedule can drive, per layout, in the order a step
#: runs them.
DRIVEN = {"dp": ("startup", "entry", "draft"), "tp": ("startup", "entry", "verify")}
#: Free memory a rank can have (GiB): plenty, short of the 1 GiB capture
#: cutoff, enough to capture but not for the folded-sampling buffers.
FREE_CHOICES = (40.0, 0.6, 1.5)
NOISE_CHOICES = (0.0, 1e-3)
LATE_CHOICES = (0.0, 0.5)
IDLE_CHOICES = (0.0, 0.3)
MAX_BUSY = 48
#: Seeds a searched schedule draws from (few: shrinking one costs runs).
SEEDS = 16
#: How much likelier a search's generated schedule takes each perturbed
#: value (and the longest run) than the simplest (see :func:`strategy`).
GENERATION_WEIGHT = 3
#: Compact verify's shape (requests, draft width) and its verify window.
VERIFY_BS, VERIFY_GAMMA = 8, 7
#: Flight-recorder entries a rank keeps: enough for the longest run.
FR_ENTRIES = 50_000

#: Decision sites: what each is, and the upstream change its divergence
#: belongs to (per layout where it differs).
SITES: dict[str, tuple[str, dict[str, str]]] = {
    "capture": (
        "draft CUDA-graph capture decision (DSparkWorkerV2.init_cuda_graphs)",
        {"tp": "spec-tp-sync", "dp": "capture-group-memory"},
    ),
    "memory": (
        "the startup free-memory reading (SpecTpSync.available_memory_gb)",
        {"tp": "spec-tp-sync", "dp": "capture-group-memory"},
    ),
    "folded": (
        "folded-sampling decision (its first sampling step)",
        {"tp": "spec-tp-sync", "dp": "capture-group-memory"},
    ),
    "draft": (
        "DSpark draft batch (DraftBlockProposer, DecodeCudaGraphRunner.can_run_graph)",
        {"*": "dp-draft-metadata"},
    ),
    "verify-lens": (
        "the verify_lens broadcast (DSparkVerifyPlanner.schedule_layout)",
        {"*": "verify-budget-broadcast", "late": "relay-wait"},
    ),
    "verify-budget": (
        "the compact-verify budget (DSparkVerifyPlanner)",
        {"*": "verify-budget-broadcast", "late": "relay-wait"},
    ),
    "verify-tier": (
        "the verify graph tier (the target verify forward's size)",
        {"*": "verify-budget-broadcast"},
    ),
    "entry": (
        "the non-overlap entry (Scheduler.run_batch -> forward_batch_generation)",
        {"*": "non-overlap-pp-proxy"},
    ),
    "step-sync": ("the scheduler's per-step sync", {}),
}
#: The sites in the order a run reaches them: startup's, then each step's.
PROGRAM_ORDER = (
    "memory",
    "capture",
    "folded",
    "step-sync",
    "entry",
    "draft",
    "verify-budget",
    "verify-lens",
    "verify-tier",
)
#: The harness functions that enter a decision's consequence, by site.
_ENTERS = {
    "_enter_capture": "capture",
    "_enter_first_sampling": "folded",
    "_enter_draft_gather": "draft",
    "_enter_verify_forward": "verify-tier",
    "_enter_step_sync": "step-sync",
}
#: What a later search leaves out once a site's divergence is found, so
#: that the next one can show (a run whose first divergence is a known one
#: shows nothing beyond it): the consequence collective (``capture``,
#: ``folded``: the same memory perturbation still reaches the other
#: decision), the code path (``driver:*``: a crash stops it), or the
#: perturbation that caused it (``perturbation:*``: the tier flip of
#: confidence noise, the ``verify_lens`` broadcast a late copy leaves; the
#: verify path stays, so either can still be found after the other).
MASK_OF = {
    "capture": "capture",
    "folded": "folded",
    "memory": "perturbation:free",
    "draft": "driver:draft",
    "entry": "driver:entry",
    "verify-tier": "perturbation:noise",
    "verify-lens": "perturbation:late",
    "verify-budget": "driver:verify",
}


def change_of(site: str, layout: str, *, late: bool = False) -> str | None:
    """The upstream change a divergence at ``site`` belongs to."""
    changes = SITES.get(site, ("", {}))[1]
    if late and "late" in changes:
        return changes["late"]
    return changes.get(layout) or changes.get("*")


# --------------------------------------------------------------------------
# Schedules.
# --------------------------------------------------------------------------


def _number(text: str, field: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{field} must be a number, got {text!r}") from None


def _integer(text: str, field: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{field} must be an integer, got {text!r}") from None


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One run's perturbations: ``steps`` decode steps on ``world`` ranks
    of ``layout``, each step's request counts, confidence noise and late
    copies drawn from ``seed``; ``free`` each rank's free memory (empty:
    plenty everywhere); ``sites`` the code paths driven (of
    :data:`DRIVEN`)."""

    layout: str
    world: int
    steps: int
    seed: int = 0
    overlap: bool = True
    free: tuple[float, ...] = ()
    noise: float = 0.0
    late: float = 0.0
    idle: float = 0.0
    sites: tuple[str, ...] = ()

    def free_of(self, rank: int) -> float:
        return self.free[rank] if self.free else FREE_CHOICES[0]

    def count(self, step: int, dp_rank: int) -> int:
        """Requests running on ``dp_rank`` at ``step``."""
        rng = random.Random(f"{self.seed}:count:{step}:{dp_rank}")
        if rng.random() < self.idle:
            return 0
        return rng.randint(1, MAX_BUSY)

    def late_at(self, step: int, rank: int) -> bool:
        """Whether ``rank``'s lagged confidence copy has not landed at
        ``step``."""
        if not self.overlap or not self.late:
            return False
        return random.Random(f"{self.seed}:late:{step}:{rank}").random() < self.late

    def validate(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(
                f"layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}"
            )
        if not is_int(self.world) or self.world not in WORLDS:
            raise ValueError(
                f"world must be one of {', '.join(map(str, WORLDS))}, got {self.world!r}"
            )
        if not is_int(self.steps) or not 1 <= self.steps <= 100_000:
            raise ValueError(f"steps must be an integer 1-100000, got {self.steps!r}")
        if not is_int(self.seed) or self.seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {self.seed!r}")
        if self.free and len(self.free) != self.world:
            raise ValueError(
                f"free must give one value per rank ({self.world}), got "
                f"{len(self.free)}: {','.join(map(str, self.free))}"
            )
        for i, value in enumerate(self.free):
            if not value >= 0 or value == float("inf"):
                raise ValueError(f"free[{i}] must be a finite GiB >= 0, got {value!r}")
        for field in ("noise", "late", "idle"):
            value = getattr(self, field)
            if not 0 <= value < 1:
                raise ValueError(f"{field} must be in [0, 1), got {value!r}")
        bad = [s for s in self.sites if s not in DRIVEN[self.layout]]
        if bad or len(set(self.sites)) != len(self.sites):
            raise ValueError(
                f"sites must name each of {', '.join(DRIVEN[self.layout])} at most "
                f"once for layout {self.layout}, got {'+'.join(self.sites)!r}"
            )

    def relevant(self, field: str) -> bool:
        """Whether ``field`` can change what this schedule's sites do."""
        sites = set(self.sites)
        return {
            "free": "startup" in sites,
            "noise": "verify" in sites,
            "late": "verify" in sites and self.overlap,
            "idle": "draft" in sites,
            "overlap": bool({"entry", "verify"} & sites),
            "seed": bool({"draft", "verify"} & sites),
            "steps": bool({"entry", "draft", "verify"} & sites),
        }.get(field, True)

    def canonical(self) -> Schedule:
        """The same run with every field it cannot depend on at its simplest
        value, so two schedules that play alike are one (run once)."""
        simplest = {
            "free": (),
            "noise": NOISE_CHOICES[0],
            "late": LATE_CHOICES[0],
            "idle": IDLE_CHOICES[0],
            "overlap": True,
            "seed": 0,
            "steps": 1,
        }
        free = self.free if any(g != FREE_CHOICES[0] for g in self.free) else ()
        out = dataclasses.replace(self, free=free)
        changes = {k: v for k, v in simplest.items() if not out.relevant(k)}
        return dataclasses.replace(out, **changes)

    def perturbations(self) -> list[str]:
        """What this schedule perturbs, in words (empty: nothing)."""
        out = []
        short = [
            f"rank {r} {g:g} GiB"
            for r, g in enumerate(self.free)
            if g != FREE_CHOICES[0]
        ]
        if short and self.relevant("free"):
            out.append(
                "free memory around the capture cutoff (" + ", ".join(short) + ")"
            )
        if self.noise and self.relevant("noise"):
            out.append(f"confidence noise {self.noise:g} per rank")
        if self.late and self.relevant("late"):
            out.append(f"lagged confidence copies late (p={self.late:g} per rank-step)")
        if self.idle and self.relevant("idle"):
            out.append(f"idle ranks (p={self.idle:g} per rank-step)")
        if not self.overlap and self.relevant("overlap"):
            out.append("overlap schedule off")
        return out

    def replay(self) -> str:
        """The schedule as one string :meth:`parse` reads back."""
        free = ",".join(f"{g:g}" for g in self.free) or "plenty"
        return ";".join(
            (
                f"layout={self.layout}",
                f"world={self.world}",
                f"steps={self.steps}",
                f"seed={self.seed}",
                f"overlap={'on' if self.overlap else 'off'}",
                f"free={free}",
                f"noise={self.noise:g}",
                f"late={self.late:g}",
                f"idle={self.idle:g}",
                f"sites={'+'.join(self.sites) or 'none'}",
            )
        )

    @classmethod
    def parse(cls, text: str) -> Schedule:
        """A schedule from :meth:`replay`'s form; ValueError names the field
        and the value that is wrong."""
        fields: dict[str, str] = {}
        for part in text.split(";"):
            if not part.strip():
                continue
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep:
                raise ValueError(f"schedule field {part.strip()!r} has no '='")
            if key in fields:
                raise ValueError(f"schedule field {key!r} is given twice")
            fields[key] = value.strip()
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ValueError(
                f"unknown schedule field {unknown[0]!r}; fields: {', '.join(sorted(known))}"
            )
        for needed in ("layout", "world", "steps"):
            if needed not in fields:
                raise ValueError(f"the schedule needs {needed}=")
        overlap = fields.get("overlap", "on")
        if overlap not in ("on", "off"):
            raise ValueError(f"overlap must be on or off, got {overlap!r}")
        free_text = fields.get("free", "plenty")
        free = (
            ()
            if free_text == "plenty"
            else tuple(
                _number(x, f"free[{i}]") for i, x in enumerate(free_text.split(","))
            )
        )
        sites_text = fields.get("sites", "none")
        sites = () if sites_text == "none" else tuple(sites_text.split("+"))
        schedule = cls(
            layout=fields["layout"],
            world=_integer(fields["world"], "world"),
            steps=_integer(fields["steps"], "steps"),
            seed=_integer(fields.get("seed", "0"), "seed"),
            overlap=overlap == "on",
            free=free,
            noise=_number(fields.get("noise", "0"), "noise"),
            late=_number(fields.get("late", "0"), "late"),
            idle=_number(fields.get("idle", "0"), "idle"),
            sites=sites,
        )
        schedule.validate()
        return schedule


def layout_of(schedule: Schedule) -> world.Layout:
    n = schedule.world
    if schedule.layout == "dp":
        return world.Layout(tp=n, dp=n)
    return world.Layout(tp=n, groups=1) if n == 2 else world.Layout(tp=n // 2, groups=2)


def soak_schedules(
    layouts: tuple[str, ...], n: int, steps: int, seed: int
) -> list[Schedule]:
    """``steps`` decode steps on ``n`` ranks in all, shared by ``layouts``,
    each layout's half with the overlap schedule on and half off."""
    runs = [(layout, overlap) for layout in layouts for overlap in (True, False)]
    each, extra = divmod(steps, len(runs))
    sizes = [each + (1 if i < extra else 0) for i in range(len(runs))]
    return [
        soak_schedule(layout, n, size, seed, overlap)
        for (layout, overlap), size in zip(runs, sizes, strict=True)
        if size > 0
    ]


def soak_schedule(
    layout: str, n: int, steps: int, seed: int, overlap: bool
) -> Schedule:
    """A long schedule with every perturbation on."""
    rng = random.Random(f"soak:{seed}:{layout}:{n}")
    free = tuple(rng.choice(FREE_CHOICES) for _ in range(n))
    return Schedule(
        layout=layout,
        world=n,
        steps=steps,
        seed=seed,
        overlap=overlap,
        free=free,
        noise=NOISE_CHOICES[-1],
        late=LATE_CHOICES[-1],
        idle=IDLE_CHOICES[-1],
        sites=DRIVEN[layout],
    )


# --------------------------------------------------------------------------
# One rank.
# --------------------------------------------------------------------------


class SiteCrash(Exception):
    """DSpark code raised at a decision site."""

    def __init__(self, site: str, text: str, cause: BaseException | None = None):
        super().__init__(f"{site}: {text}")
        self.site = site
        self.text = text
        #: Where in SGLang it raised (the first SGLang frame outside its
        #: communication layer, innermost first; empty: not known).
        self.call_site = ""
        if cause is not None and cause.__traceback__ is not None:
            from sglang_dspark_dp.adapter.sites import sglang_call_site

            frames = traceback.extract_tb(cause.__traceback__)
            self.call_site = sglang_call_site(
                tuple((f.name, f.filename, f.lineno or 0) for f in reversed(frames))
            )


def _rows(n: int) -> Any:
    """A tensor of ``n`` rows and no columns: the recorder keeps its shape
    (the decision), gloo moves no bytes, so ranks that disagree on ``n`` are
    recorded apart instead of aborting the transport."""
    import torch

    return torch.zeros((max(int(n), 0), 0), dtype=torch.int64)


def _enter_step_sync(n: int) -> None:
    """The scheduler's per-step sync over the world (every rank knows every
    rank's request count from the schedule; this marks the step)."""
    import torch.distributed as dist

    dist.all_gather_into_tensor(_rows(n * 3), _rows(3))


def _enter_capture(group: Any) -> None:
    """A rank that captures draft graphs waits in the capture barrier."""
    group.barrier()


def _enter_first_sampling(group: Any, folded: bool) -> None:
    """The first sampling step: the folded sampler reduces its fused top-k
    over the group; the eager proposal gathers the draft tokens instead."""
    import torch.distributed as dist

    if group.world_size < 2:
        return
    if folded:
        dist.all_reduce(_rows(2), group=group.cpu_group)
    else:
        dist.all_gather_into_tensor(
            _rows(group.world_size), _rows(1), group=group.cpu_group
        )


def _enter_draft_gather(padded_tokens: int, n: int) -> None:
    """The draft forward's DP gather, sized by the padded token count."""
    import torch.distributed as dist

    dist.all_gather_into_tensor(_rows(n * padded_tokens), _rows(padded_tokens))


def _enter_verify_forward(group: Any, tokens: int) -> None:
    """The target verify forward's all-reduce, sized by its graph tier."""
    import torch.distributed as dist

    if group.world_size > 1:
        dist.all_reduce(_rows(tokens), group=group.cpu_group)


def repairs_as(fix: bool) -> Any:
    """A context in which every repair is as a server has it with the
    plugin on (``fix``: each one's own probe and hook) or off (none hooked),
    in this process, which forked ranks inherit; on leaving, each repair is
    instrumented or not as it was found."""
    import contextlib

    from sglang_dspark_dp import registry

    @contextlib.contextmanager
    def context() -> Any:
        was = {n: registry.repair(n).instrumented for n in registry.names()}
        _set_repairs(fix)
        try:
            yield
        finally:
            for name, on in was.items():
                repair = registry.repair(name)
                if on and not repair.instrumented:
                    repair.instrument(apply=True)
                elif not on and repair.instrumented:
                    repair.uninstrument()

    return context()


def _set_repairs(fix: bool) -> None:
    from sglang_dspark_dp import registry

    if _repairs_are(fix):
        return
    registry.uninstrument()
    if fix:
        for name in registry.names():
            registry.repair(name).instrument(apply=True)


def _repairs_are(fix: bool) -> bool:
    """Every repair probed (``fix``; hooked where it is needed), or none
    hooked."""
    from sglang_dspark_dp import registry
    from sglang_dspark_dp.outcome import Outcome

    repairs = [registry.repair(n) for n in registry.names()]
    if fix:
        return all(r.status().outcome is not Outcome.NOT_INSTRUMENTED for r in repairs)
    return not any(r.instrumented for r in repairs)


def _pg_ranks(groups_made: list[Any]) -> dict[str, list[int]]:
    import torch.distributed as dist

    out: dict[str, list[int]] = {}
    pgs = [dist.group.WORLD]
    for g in groups_made:
        pgs.append(getattr(g, "cpu_group", None))
    for pg in pgs:
        if pg is None:
            continue
        try:
            out[str(pg.group_name)] = list(dist.get_process_group_ranks(pg))
        except (RuntimeError, ValueError, AttributeError):
            continue
    return out


class _Rank:
    """One rank's run of a schedule (see the module)."""

    def __init__(self, rank: int, sched: Schedule, masks: frozenset[str]) -> None:
        self.rank = rank
        self.sched = sched
        self.masks = masks
        self.layout = layout_of(sched)
        self.steps: list[dict[str, Any]] = []
        self.startup: dict[str, Any] = {}
        self.site = ""
        self.step = -1
        self.groups_made: list[Any] = []

    def drive(self, fix: bool, port: int, hang_s: float) -> None:
        import torch

        torch.set_num_threads(1)
        sched, rank = self.sched, self.rank
        _set_repairs(fix)  # inherited from the parent (repairs_as) as a rule
        world.join(rank, sched.world, port, hang_s)
        self.site = "startup"
        if "startup" in sched.sites:
            self._startup(hang_s)
        drivers = self._drivers(hang_s)
        dp_rank = rank if sched.layout == "dp" else 0
        for t in range(sched.steps):
            self.step = t
            count = sched.count(t, dp_rank)
            record: dict[str, Any] = {"t": t, "count": count}
            self.steps.append(record)  # filled in as the step goes
            self.site = "step-sync"
            _enter_step_sync(sched.world)
            rows = [[c, c, 1] for c in (sched.count(t, r) for r in range(sched.world))]
            if "entry" in drivers:
                self.site = "entry"
                outcome = drivers["entry"](prefill=t == 0)
                if outcome.error:
                    raise SiteCrash("entry", outcome.error)
            if "draft" in drivers:
                self.site = "draft"
                record.update(drivers["draft"](rows))
            if "verify" in drivers:
                self.site = "verify"
                record.update(drivers["verify"](t, record))
            record["done"] = True
        self.site = "done"

    # -- startup ---------------------------------------------------------

    def _startup(self, hang_s: float) -> None:
        import logging

        from sglang_dspark_dp import adapter
        from sglang_dspark_dp.adapter.worker import SAMPLER_MODULE
        from sglang_dspark_dp.harness import startup

        module, cls = adapter.load_worker()
        # The stock warnings of a rank that skips capture or folding are the
        # decisions this run records; keep them out of the output.
        for name in (module.__name__, SAMPLER_MODULE):
            logging.getLogger(name).setLevel(logging.ERROR)
        capture, runner_tp, dp_tp = world.startup_groups(
            self.rank, self.layout, hang_s=hang_s, coordinator=False
        )
        self.groups_made += [capture, runner_tp, dp_tp]
        told: list[bool] = []
        masks = self.masks

        free = self.sched.free_of(self.rank)
        self.startup = {"free_gib": free}

        def on_capture(capture_graphs: bool) -> None:
            told.append(capture_graphs)
            self.startup["captured"] = bool(capture_graphs)  # before it waits
            if capture_graphs and "capture" not in masks:
                _enter_capture(capture)

        worker, recorded = startup.stand_in_worker(
            module,
            cls,
            capture=capture,
            runner_tp=runner_tp,
            dp_tp=dp_tp,
            dense_draft=False,
            on_capture=on_capture,
            dp_attention=self.layout.dp_attention,
        )
        startup.init_graphs(module, cls, worker, recorded, free)
        self.startup.update(
            captured=bool(told and told[-1]),
            folded=worker.folded,
            read_gib=[r.value for r in recorded.readings],
        )
        if worker.folded is not None and "folded" not in masks:
            self.site = "folded"
            _enter_first_sampling(capture, worker.folded)

    # -- per-step drivers --------------------------------------------------

    def _drivers(self, hang_s: float) -> dict[str, Any]:
        sites = [s for s in self.sched.sites if s != "startup"]
        sites = [s for s in sites if f"driver:{s}" not in self.masks]
        out: dict[str, Any] = {}
        if "entry" in sites and not self.sched.overlap:
            out["entry"] = self._entry_driver()
        if "draft" in sites:
            out["draft"] = self._draft_driver()
        if "verify" in sites:
            out["verify"] = self._verify_driver(hang_s)
        return out

    def _entry_driver(self) -> Any:
        from sglang_dspark_dp import adapter
        from sglang_dspark_dp.adapter.scheduler import load_scheduler
        from sglang_dspark_dp.drivers.scheduler import non_overlap_step

        api = adapter.load_sglang_api()
        module, cls = load_scheduler()
        _, worker_cls = adapter.load_worker()
        return functools.partial(non_overlap_step, api, module, cls, worker_cls)

    def _draft_driver(self) -> Any:
        from sglang_dspark_dp import adapter
        from sglang_dspark_dp.drivers import DRAFT_WIDTH, MAX_CAPTURE_BS
        from sglang_dspark_dp.harness import lockstep
        from sglang_dspark_dp.srt.speculative.dspark_components import dspark_draft

        n = self.sched.world
        api = adapter.load_sglang_api()
        writer = adapter.load_sync_writer()
        repair = dspark_draft.REPAIR
        probe = repair.probe_result if repair.instrumented else None
        names = probe.names if probe is not None else dspark_draft.probe(api).names
        capture = adapter.capture_sizes(MAX_CAPTURE_BS)
        graph = adapter.graph_runner(
            api, dp_size=n, width=DRAFT_WIDTH, capture_bs=capture
        )
        driver, wants_device = lockstep.draft_driver(
            api, graph=graph, names=names, ep=n, dp_size=n, dp_rank=self.rank
        )
        cfg = lockstep.RunConfig(dp=n, ep_sizes=(n,), attn_tp=1)

        def step(rows: list[list[int]]) -> dict[str, Any]:
            raised: list[BaseException] = []
            decision, text = lockstep.draft_decision(
                api,
                writer,
                driver,
                rows,
                self.rank,
                cfg,
                n,
                capture,
                wants_device,
                raised=raised,
            )
            if decision[0] == 0:
                raise SiteCrash("draft", text, raised[0] if raised else None)
            padded = decision[3]
            _enter_draft_gather(padded, n)
            return {"admitted": decision[1], "bucket": decision[2], "padded": padded}

        return step

    def _verify_driver(self, hang_s: float) -> Any:
        import torch

        from sglang_dspark_dp.adapter import planner as sg_planner
        from sglang_dspark_dp.harness import compact_verify

        sched = self.sched
        os.environ["SGLANG_RAGGED_VERIFY_MODE"] = "compact"
        module, cls = sg_planner.load_planner()
        group, index = world.verify_group(
            self.rank, self.layout, hang_s=hang_s, coordinator=False
        )
        self.groups_made.append(group)
        sps_path = _SPS_PATH[0]
        verifier = compact_verify.VerifyRank(
            module,
            cls,
            group=group,
            tp=self.layout.tp,
            bs=VERIFY_BS,
            gamma=VERIFY_GAMMA,
            overlap=sched.overlap,
            sps_path=sps_path,
            drift=True,
        ).__enter__()
        self._verifier = verifier
        shared = torch.Generator().manual_seed(sched.seed * 7919 + index)
        shape = torch.rand((VERIFY_BS, VERIFY_GAMMA), generator=shared) * 0.6 + 0.4
        base = verifier.near_tie(shape)
        own = torch.Generator().manual_seed(sched.seed * 1000 + self.rank + 1)
        window = VERIFY_BS * (VERIFY_GAMMA + 1)

        def step(t: int, record: dict[str, Any]) -> dict[str, Any]:
            noise = torch.rand((VERIFY_BS, VERIFY_GAMMA), generator=own) * 2 - 1
            confidence = (base + noise * sched.noise).clamp(0.0, 1.0)
            late = sched.late_at(t, self.rank)
            record["late"] = late
            budget, tier = verifier.step(confidence, late=late)
            self.site = "verify-tier"
            _enter_verify_forward(group, tier or window)
            return {"late": late, "budget": budget, "tier": tier}

        return step


#: The SPS table file of a run (written by the parent, read by the ranks).
_SPS_PATH: list[str] = [""]


def _sidecar_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"decisions-{rank}.json")


def _rank_body(
    rank: int,
    sched: Schedule,
    masks: frozenset[str],
    fix: bool,
    port: int,
    hang_s: float,
    dump_dir: str,
    watch: bool = False,
) -> dict[str, Any]:
    flight.enable(FR_ENTRIES)
    me = _Rank(rank, sched, masks)
    error: dict[str, Any] = {}
    alarms: list[str] = []
    if watch:  # log mode: the run goes on to the collective it leads to
        world.watch_on("log")
    try:
        me.drive(fix, port, hang_s)
    except SiteCrash as exc:
        error = {
            "site": exc.site,
            "step": me.step,
            "kind": "crash",
            "text": exc.text,
            "call_site": exc.call_site,
        }
    except Exception as exc:
        text = "".join(traceback.format_exception_only(exc)).strip()[-600:]
        kind = "timeout" if "Timed out" in text or "timed out" in text else "error"
        error = {"site": me.site, "step": me.step, "kind": kind, "text": text}
        if kind == "error":
            error["traceback"] = "".join(traceback.format_exception(exc))[-2000:]
    if watch:
        from sglang_dspark_dp import watch as consensus_watch

        # What it said, whether or not its queue could still be compared.
        alarms = consensus_watch.alarms()
        alarms += [a for a in world.watch_off() if a not in alarms]
    report = {
        "rank": rank,
        "steps": me.steps,
        "startup": me.startup,
        "error": error,
        "pg_ranks": _pg_ranks(me.groups_made),
        "layout": sched.layout,
        "schedule": sched.replay(),
        "alarms": alarms,
    }
    try:
        flight.dump(dump_dir, rank)
        with open(_sidecar_path(dump_dir, rank), "w") as f:
            json.dump(report, f)
    except Exception as exc:  # the report still says what happened
        report["dump_error"] = f"{type(exc).__name__}: {exc}"
    keep = ("rank", "error", "dump_error", "alarms")
    return {k: report[k] for k in keep if k in report} | {
        "steps_done": sum(1 for r in me.steps if r.get("done"))
    }


def _rank_failed(rank: int, why: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "error": {"kind": "died", "site": "", "step": -1, "text": why},
    }


# --------------------------------------------------------------------------
# What a run found.
# --------------------------------------------------------------------------


@dataclasses.dataclass
class Finding:
    """A divergence (or a crash every rank hit) and where it belongs."""

    kind: str  # "op" | "sizes" | "dtypes" | "missing" | "crash"
    site: str
    change: str | None
    step: int | None  # the decode step (None: at startup)
    ranks: dict[int, str]  # what each rank entered or raised there
    call_sites: dict[int, str]
    inputs: dict[int, dict[str, Any]]  # each rank's decision inputs there
    schedule: Schedule
    detail: str = ""
    #: What found it first: "watch" (the consensus watch named the decision
    #: before the collective it leads to), "flight recorder" (a collective
    #: the ranks entered differently) or "crash" (every such rank raised).
    detector: str = ""
    #: The watch's first alarm line, where the run had the watch on.
    watch: str = ""

    @property
    def found_by(self) -> str:
        if self.detector:
            return self.detector
        return "crash" if self.kind == "crash" else "flight recorder"

    @property
    def mask(self) -> str:
        return MASK_OF.get(self.site, f"driver:{self.site}")

    def title(self) -> str:
        from sglang_dspark_dp import upstream

        what = SITES.get(self.site, (self.site, {}))[0]
        if self.change:
            c = upstream.change(self.change)
            label = c.label if c.label == c.key else f"{c.label} {c.key}"
        else:
            label = "no known change"
        return f"{label}: {what}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "site": self.site,
            "change": self.change,
            "title": self.title(),
            "step": self.step,
            "ranks": {str(k): v for k, v in self.ranks.items()},
            "call_sites": {str(k): v for k, v in self.call_sites.items()},
            "inputs": {str(k): v for k, v in self.inputs.items()},
            "perturbations": self.schedule.perturbations(),
            "replay": self.schedule.replay(),
            "detail": self.detail,
            "detector": self.found_by,
            "watch": self.watch,
        }


@dataclasses.dataclass
class RunOutcome:
    schedule: Schedule
    fix: bool
    masks: frozenset[str]
    finding: Finding | None
    errors: dict[int, dict[str, Any]]
    steps_done: dict[int, int]
    seconds: float
    mismatch: flight.Mismatch | None = None
    #: Rank -> the watch's alarm lines there (runs with ``watch``).
    alarms: dict[int, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.finding is not None

    @property
    def complete(self) -> bool:
        return not self.errors and all(
            n == self.schedule.steps for n in self.steps_done.values()
        )


def site_of(entry: flight.Entry) -> str:
    """The decision site an entry came from: the harness function that
    entered a consequence, else the first SGLang frame the adapter names."""
    from sglang_dspark_dp.adapter.sites import decision_site

    for name, filename, _ in entry.frames:
        if name in _ENTERS and f"{os.sep}sglang_dspark_dp{os.sep}" in filename:
            return _ENTERS[name]
    return decision_site(entry.frames) or ""


def _step_of(dump: flight.RankDump, entry: flight.Entry) -> int | None:
    """The decode step of ``entry`` on its rank: how many per-step syncs the
    rank entered before it (None: before the first, i.e. at startup)."""
    syncs = [
        e.record_id
        for e in dump.entries
        if e.record_id <= entry.record_id and site_of(e) == "step-sync"
    ]
    if not syncs:
        return None
    return len(syncs) - 1


def _program_position(
    dumps: dict[int, flight.RankDump], mismatch: flight.Mismatch
) -> tuple[int, int]:
    """Where a mismatch sits in the program: the earliest step and site of
    what its ranks entered (startup before step 0; a site this module does
    not know last). A rank that skips a collective of one group enters the
    next one of another, which the others never reach: both groups part,
    and the earlier in the program is the divergence."""
    return min(
        (
            -1 if (step := _step_of(dumps[e.rank], e)) is None else step,
            PROGRAM_ORDER.index(site)
            if (site := site_of(e)) in PROGRAM_ORDER
            else len(PROGRAM_ORDER),
        )
        for e in mismatch.present()
    )


def _inputs(sidecars: dict[int, dict[str, Any]], rank: int, step: int | None):
    side = sidecars.get(rank, {})
    if step is None:
        return dict(side.get("startup", {}))
    steps = side.get("steps", [])
    return dict(steps[step]) if 0 <= step < len(steps) else {"t": step}


def explain(
    dumps: dict[int, flight.RankDump],
    sidecars: dict[int, dict[str, Any]],
    schedule: Schedule | None,
) -> tuple[flight.Mismatch | None, Finding | None]:
    """The first mismatch in ``dumps`` and the finding it makes (with the
    sidecars' decision inputs where a run of this tool wrote them)."""
    pg_ranks = {}
    for side in sidecars.values():
        for pg, ranks in side.get("pg_ranks", {}).items():
            pg_ranks.setdefault(pg, set()).update(ranks)
    mismatch = flight.first_mismatch(
        dumps,
        {pg: tuple(sorted(r)) for pg, r in pg_ranks.items()},
        order=functools.partial(_program_position, dumps),
    )
    if mismatch is None:
        return None, None
    layout = schedule.layout if schedule is not None else ""
    present = mismatch.present()
    # The per-step sync only marks a step: where ranks part at it, the site
    # is where a rank that never came was instead.
    instead = [e for r, e in mismatch.last.items() if mismatch.entries.get(r) is None]
    candidates = [e for e in [*present, *instead] if e is not None]
    anchor = next(
        (e for e in candidates if site_of(e) not in ("", "step-sync")), present[0]
    )
    site = site_of(anchor)
    step = _step_of(dumps[anchor.rank], anchor)
    ranks, call_sites, inputs = {}, {}, {}
    for r in mismatch.ranks:
        e = mismatch.entries[r]
        if e is None:
            last = mismatch.last.get(r)
            where = (
                f"{last.describe()} at {site_of(last) or '?'}" if last else "nothing"
            )
            ranks[r] = f"never entered it (last: {where})"
            call_sites[r] = (last.call_site() or site_of(last)) if last else ""
        else:
            ranks[r] = f"{e.describe()} at {site_of(e) or '?'}"
            call_sites[r] = e.call_site() or f"{e.harness_site() or '?'} (harness)"
        inputs[r] = _inputs(sidecars, r, step)
    late = any(bool(i.get("late")) for i in inputs.values())
    note = ""
    if layout:
        change = change_of(site, layout, late=late)
    else:  # a server's dumps: its layout is not in them
        change = change_of(site, "dp") or change_of(site, "*", late=late)
        other = change_of(site, "tp")
        if other and other != change:
            from sglang_dspark_dp import upstream

            c = upstream.change(other)
            note = (
                f"the layout is not in the dumps: under DP attention this is "
                f"{change}; under plain TP it is {c.label} {c.key}"
            )
    finding = Finding(
        kind=mismatch.kind,
        site=site,
        change=change,
        step=step,
        ranks=ranks,
        call_sites=call_sites,
        inputs=inputs,
        schedule=schedule or Schedule(layout="dp", world=max(2, len(dumps)), steps=1),
        detail=mismatch.describe() + (f"; {note}" if note else ""),
    )
    return mismatch, finding


def load_sidecars(directory: str) -> dict[int, dict[str, Any]]:
    out = {}
    for name in os.listdir(directory):
        if name.startswith("decisions-") and name.endswith(".json"):
            try:
                with open(os.path.join(directory, name)) as f:
                    side = json.load(f)
                out[int(side["rank"])] = side
            except (OSError, ValueError, KeyError, TypeError):
                continue
    return out


def _crash_finding(
    sched: Schedule, errors: dict[int, dict[str, Any]], sidecars
) -> Finding | None:
    crashes = {r: e for r, e in errors.items() if e.get("kind") == "crash"}
    if not crashes:
        return None
    first = min(crashes.values(), key=lambda e: (e.get("step", 0), e.get("site", "")))
    site, step = first["site"], first.get("step")
    return Finding(
        kind="crash",
        site=site,
        change=change_of(site, sched.layout),
        step=step,
        ranks={r: f"raised: {e['text'][:300]}" for r, e in sorted(crashes.items())},
        call_sites={
            r: e.get("call_site") or SITES.get(site, (site, {}))[0]
            for r, e in crashes.items()
        },
        inputs={r: _inputs(sidecars, r, step) for r in crashes},
        schedule=sched,
        detail=f"{len(crashes)} of {sched.world} ranks raised at {site}",
    )


# --------------------------------------------------------------------------
# Running.
# --------------------------------------------------------------------------


def _check_installed() -> None:
    """Import what the ranks drive, so forked ranks start warm; CannotRun
    (one line) where the installed SGLang has no DSpark code to drive or
    hypothesis is missing."""
    from sglang_dspark_dp import adapter, registry
    from sglang_dspark_dp.adapter import planner as sg_planner
    from sglang_dspark_dp.adapter.scheduler import load_scheduler
    from sglang_dspark_dp.outcome import DidNotEnable

    try:
        adapter.load_sglang_api()
        adapter.load_sync_writer()
        adapter.load_worker()
        sg_planner.load_planner()
        load_scheduler()
        for name in registry.names():
            registry.repair(name)
        import hypothesis  # noqa: F401

        from sglang_dspark_dp.drivers import (  # noqa: F401
            draft,
            planner,
            scheduler,
            worker,
        )
        from sglang_dspark_dp.harness import compact_verify, startup  # noqa: F401
    except DidNotEnable as exc:
        raise CannotRun(str(exc)) from exc
    except ImportError as exc:
        raise CannotRun(
            f"diverge needs hypothesis ({exc}); install the plugin's extra: "
            "pip install 'sglang-dspark-dp[diverge]'"
        ) from exc


def _write_sps() -> str:
    from sglang_dspark_dp.harness import compact_verify

    cfg = compact_verify.CompactConfig(bs=VERIFY_BS, gamma=VERIFY_GAMMA)
    return compact_verify.write_sps_table(cfg)


def run(
    sched: Schedule,
    *,
    fix: bool,
    masks: frozenset[str] = frozenset(),
    hang_s: float = 3.0,
    dump_dir: str | None = None,
    port: int = 0,
    watch: bool = False,
) -> RunOutcome:
    """Play ``sched`` once; the flight-recorder dumps and the ranks'
    decision sidecars go to ``dump_dir`` (a scratch folder, removed, when
    None). ``watch``: every rank runs the consensus watch (log mode) beside
    the flight recorder, and a finding the watch named first says so
    (``detector``)."""
    sched.validate()
    _check_installed()
    if not _repairs_are(fix):
        with repairs_as(fix):
            if not _repairs_are(fix):
                raise CannotRun(
                    f"the repairs could not be set {'on' if fix else 'off'}"
                )
            return run(
                sched,
                fix=fix,
                masks=masks,
                hang_s=hang_s,
                dump_dir=dump_dir,
                port=port,
                watch=watch,
            )
    scratch = dump_dir is None
    directory = tempfile.mkdtemp(prefix="dspark-fr-") if scratch else dump_dir
    os.makedirs(directory, exist_ok=True)
    port = free_port(port)
    _SPS_PATH[0] = _write_sps() if "verify" in sched.sites else ""
    start = time.monotonic()
    # Startup, then every step, then a rank left waiting in one collective:
    # a generous bound for the run, past which the parent kills it.
    timeout_s = 60.0 + hang_s * 4 + sched.steps * sched.world * 0.05
    try:
        reports = run_ranks(
            sched.world,
            functools.partial(
                _rank_body,
                sched=sched,
                masks=frozenset(masks),
                fix=fix,
                port=port,
                hang_s=hang_s,
                dump_dir=directory,
                watch=watch,
            ),
            _rank_failed,
            timeout_s=timeout_s,
        )
        errors: dict[int, dict[str, Any]] = {}
        steps_done: dict[int, int] = {}
        alarms: dict[int, list[str]] = {}
        for r in range(sched.world):
            rep = reports.get(r)
            if rep is None:
                errors[r] = {
                    "kind": "hung",
                    "site": "",
                    "step": -1,
                    "text": f"no report within {timeout_s:.0f} s (killed)",
                }
                continue
            steps_done[r] = int(rep.get("steps_done", 0))
            if rep.get("alarms"):
                alarms[r] = list(rep["alarms"])
            if rep.get("error"):
                errors[r] = rep["error"]
        dumps = {}
        try:
            dumps = flight.load_dir(directory)
        except flight.DumpError:
            pass
        sidecars = load_sidecars(directory)
        if any(steps_done.values()) and not any(d.entries for d in dumps.values()):
            raise CannotRun(
                "the flight recorder kept no collective in the ranks (this process "
                f"made a process group before {flight.BUFFER_ENV} was set?)"
            )
        mismatch, finding = explain(dumps, sidecars, sched) if dumps else (None, None)
        if finding is None:
            finding = _crash_finding(sched, errors, sidecars)
        said = [line for r in sorted(alarms) for line in alarms[r]]
        if finding is not None and said:
            # The watch compares before the collective a decision leads to
            # (the startup capture decision synchronously): it came first.
            finding.detector, finding.watch = "watch", said[0]
        return RunOutcome(
            schedule=sched,
            fix=fix,
            masks=frozenset(masks),
            finding=finding,
            errors=errors,
            steps_done=steps_done,
            seconds=time.monotonic() - start,
            mismatch=mismatch,
            alarms=alarms,
        )
    finally:
        if _SPS_PATH[0]:
            try:
                os.unlink(_SPS_PATH[0])
            except OSError:
                pass
        if scratch:
            shutil.rmtree(directory, ignore_errors=True)


# --------------------------------------------------------------------------
# Searching.
# --------------------------------------------------------------------------


def strategy(layout: str, n: int, *, max_steps: int, masks: frozenset[str]) -> Any:
    """Schedules of ``layout`` on ``n`` ranks, each perturbation's simplest
    value first (what hypothesis shrinks towards), the code paths drawn
    first (shrunk first); a masked path or perturbation is left out.

    Generation leans away from the simplest values (each other value, and
    the longest run, :data:`GENERATION_WEIGHT` times as likely): a late copy
    shows only on a long enough overlap run of the verify path, and a
    search of a few dozen runs must still reach it; shrinking goes back to
    the simplest all the same."""
    from hypothesis import strategies as st

    driven = [s for s in DRIVEN[layout] if f"driver:{s}" not in masks]

    def leaning(values: tuple[Any, ...]) -> Any:
        return st.sampled_from(values[:1] + values[1:] * GENERATION_WEIGHT)

    def choice(name: str, values: tuple[Any, ...]) -> Any:
        if f"perturbation:{name}" in masks:
            return st.just(values[0])
        return leaning(values)

    @st.composite
    def schedules(draw: Any) -> Schedule:
        # One switch per code path: each shrinks to off on its own.
        picked = tuple(s for s in driven if draw(st.booleans()))
        # Every field is drawn, in one order, whatever the paths: turning a
        # path off then leaves the other draws where they were, which is
        # what lets the shrinker drop it (the canonical form sets what the
        # paths cannot depend on to its simplest, so such examples repeat a
        # run: the search counts the runs it makes, not the examples).
        overlap = draw(st.sampled_from((True, False)))
        free = tuple(draw(choice("free", FREE_CHOICES)) for _ in range(n))
        longest = (max_steps,) * (GENERATION_WEIGHT - 1)
        steps = draw(st.sampled_from((*range(1, max_steps + 1), *longest)))
        out = Schedule(
            layout=layout,
            world=n,
            sites=picked,
            overlap=overlap,
            free=free,
            steps=steps,
            noise=draw(choice("noise", NOISE_CHOICES)),
            late=draw(choice("late", LATE_CHOICES)),
            idle=draw(choice("idle", IDLE_CHOICES)),
            seed=draw(st.integers(0, SEEDS - 1)),
        )
        return out.canonical()

    return schedules()


class _Budget(Exception):
    """The search's run budget is spent."""


#: Examples hypothesis may generate per run a search may make (the rest
#: repeat a canonical schedule already run, which costs nothing).
EXAMPLES_PER_RUN = 10


@dataclasses.dataclass
class Search:
    """One search: the finding (None: none), its runs and seconds."""

    layout: str
    world: int
    finding: Finding | None
    runs: int
    shrink_runs: int
    seconds: float
    outcome: RunOutcome | None = None


def search(
    layout: str,
    n: int,
    *,
    fix: bool,
    masks: frozenset[str] = frozenset(),
    examples: int = 40,
    shrink_runs: int = 24,
    max_steps: int = 6,
    seed: int = 0,
    hang_s: float = 3.0,
    on_run: Any = None,
    known: frozenset[tuple[str, str | None]] = frozenset(),
    watch: bool = False,
) -> Search:
    """Run up to ``examples`` generated schedules (distinct canonical ones)
    until one diverges in a way not ``known`` (``(site, change)`` of
    earlier findings), then shrink it with
    at most ``shrink_runs`` more runs, keeping it new; the smallest such
    schedule found and its finding. ``watch``: every run with the consensus
    watch on (see :func:`run`)."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    start = time.monotonic()
    outcomes: dict[Schedule, RunOutcome] = {}
    state = {"runs": 0, "first": None, "shrinks": 0}

    def new(out: RunOutcome) -> bool:
        f = out.finding
        return f is not None and (f.site, f.change) not in known

    def diverges(s: Schedule) -> bool:
        if s in outcomes:
            return new(outcomes[s])
        if state["first"] is not None:
            if state["shrinks"] >= shrink_runs:
                raise _Budget
            state["shrinks"] += 1
        elif state["runs"] >= examples:
            raise _Budget  # as many runs as examples, none new
        out = run(s, fix=fix, masks=masks, hang_s=hang_s, watch=watch)
        state["runs"] += 1
        outcomes[s] = out
        if on_run is not None:
            on_run(out)
        if new(out) and state["first"] is None:
            state["first"] = s
        return new(out)

    smallest: Schedule | None = None
    try:
        with repairs_as(fix):
            smallest = find(
                strategy(layout, n, max_steps=max_steps, masks=masks),
                diverges,
                settings=settings(
                    max_examples=examples * EXAMPLES_PER_RUN,
                    database=None,
                    deadline=None,
                    phases=[Phase.generate, Phase.shrink],
                    suppress_health_check=list(HealthCheck),
                ),
                random=random.Random(seed),
            )
    except NoSuchExample:
        smallest = None
    except _Budget:
        diverging = [s for s, o in outcomes.items() if new(o)]
        smallest = min(diverging, key=_size) if diverging else None
    outcome = outcomes.get(smallest) if smallest is not None else None
    return Search(
        layout=layout,
        world=n,
        finding=outcome.finding if outcome else None,
        runs=state["runs"],
        shrink_runs=state["shrinks"],
        seconds=time.monotonic() - start,
        outcome=outcome,
    )


def _size(s: Schedule) -> tuple[Any, ...]:
    """Smaller is simpler (hypothesis's own order among what it tried)."""
    return (
        len(s.sites),
        s.steps,
        sum(g != FREE_CHOICES[0] for g in s.free),
        bool(s.noise) + bool(s.late) + bool(s.idle) + (not s.overlap),
        s.seed,
    )


def discover(
    layouts: tuple[str, ...],
    n: int,
    *,
    fix: bool,
    max_findings: int = 8,
    on_search: Any = None,
    **kwargs: Any,
) -> list[Search]:
    """Search each layout again and again, masking each finding's site
    (its consequence, or the code path it crashed in), until a search finds
    nothing new; every search, the last one empty. A finding whose change
    is the same under every layout (the non-overlap entry, say) stays
    masked in the later layouts' searches: it is one defect, found once."""
    out: list[Search] = []
    everywhere: frozenset[str] = frozenset()
    for layout in layouts:
        masks = everywhere
        while len([s for s in out if s.finding]) < max_findings:
            known = frozenset(
                (s.finding.site, s.finding.change) for s in out if s.finding
            )
            found = search(layout, n, fix=fix, masks=masks, known=known, **kwargs)
            out.append(found)
            if on_search is not None:
                on_search(found)
            f = found.finding
            if f is None or f.mask in masks:
                break
            masks = masks | {f.mask}
            if all(change_of(f.site, other) == f.change for other in layouts):
                everywhere = everywhere | {f.mask}
    return out


def validate_world(n: Any) -> int:
    if not is_int(n) or n not in WORLDS:
        raise CannotRun(
            f"--ranks must be among {', '.join(map(str, WORLDS))}, got {n!r}"
        )
    return n


check_installed = _check_installed
