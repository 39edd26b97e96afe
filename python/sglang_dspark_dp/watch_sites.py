"""Where the watch looks: the AROUND hooks on DSpark's decisions that hand
each decision to :mod:`sglang_dspark_dp.watch`.

Each site is hooked outside the repairs' hooks on the same method
(registered after them), so it sees the decision the repaired code takes:

* ``startup``: ``DSparkWorkerV2.init_cuda_graphs``. The draft CUDA-graph
  capture decision (and the free-memory reading it compared with the
  cutoff) is checked over the capture group when the worker hands it to
  its draft worker, before the draft worker enters the capture barriers,
  synchronously: a divergence is a report, not the hang. With it, the
  folded-sampling decision (0.5.17-0.5.21: whether the sampling buffers
  are baked into the graphs about to be captured; "not taken" where no
  sampler was built). Both belong to #33614
  (``spec-tp-sync``) under plain TP and to #39954 (``capture-group-memory``)
  under DP attention.
* ``compact-verify``: ``DSparkVerifyPlanner.schedule_layout``, every decode
  step, over the ``verify_lens`` broadcast's group: the budget it is given,
  whether it enters the broadcast (noted as it enters, so a rank left
  waiting in it has said so), and the graph tier of the layout it returns.
  They belong to #31195 (``verify-budget-broadcast``), and under overlap to
  ``relay-wait`` too. Only enqueued: the scheduler thread never waits.
* ``draft-batch``: ``DraftBlockProposer._fill_dp_moe_sync_metadata``, every
  draft step on the DP-attention path (busy and idle ranks alike), over the
  draft runner's TP group (the world the sizes were gathered over): the DP
  sync sizes the draft batch carries (scaled per rank, for logprobs, and
  the raw per-rank counts) and its CUDA-graph admission. The graph size and
  the padded token count are SGLang's functions of these two on every rank.
  They belong to #33098 (``dp-draft-metadata``). Only enqueued.
* ``worker-entry``: ``DSparkWorkerV2.forward_batch_generation``, every step
  (prefill, decode, idle), over the draft runner's TP group: whether the
  scheduler's call reached the worker's body (noted as it enters the body,
  before any collective there, or when the call is refused), with the
  keyword arguments the scheduler passed. A rank whose call was refused
  (#39262's ``TypeError`` with the overlap schedule off, where the
  ``non-overlap-pp-proxy`` repair did not apply on that rank alone) is
  named beside its peers that went on into the step's collectives. Only
  enqueued.

:func:`instrument` hooks every site whose SGLang module is imported (the
registry's arming calls it with the repairs of the same module, before it
applies the hooks); :func:`uninstrument` takes them off.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging
import sys
from collections.abc import Callable
from typing import Any

from sglang_dspark_dp import watch
from sglang_dspark_dp.adapter.modules import (
    DRAFT_MODULE,
    PLANNER_MODULE,
    WORKER_MODULE,
)

logger = logging.getLogger("sglang_dspark_dp")

#: The decisions, as the line names them.
CAPTURE = "draft CUDA-graph capture"
FOLDED = "folded-sampling"
VERIFY_BUDGET = "compact-verify budget"
VERIFY_BROADCAST = "verify_lens broadcast entry"
VERIFY_TIER = "verify graph tier"
DRAFT_SIZES = "draft DP sync sizes"
DRAFT_ADMISSION = "draft graph admission"
ENTRY = "worker step entry"
#: When the startup decision is taken.
STARTUP = "startup"


@dataclasses.dataclass
class Site:
    """One watched method: its name, the SGLang module whose import arms
    it, and what builds its hook (``(target, owner, attr, around)``)."""

    name: str
    module: str
    build: Callable[[], tuple[str, type, str, Any]]
    decisions: tuple[str, ...] = ()
    #: A decision only some builds take, and what says whether this one does.
    taken_where: dict[str, Callable[[], bool]] = dataclasses.field(default_factory=dict)
    hooked: tuple[str, type, str, Any, Any] | None = None  # ... and the stock

    def decisions_here(self) -> list[str]:
        """Its decisions this build takes."""
        return [d for d in self.decisions if self.taken_where.get(d, lambda: True)()]


def _folded_taken() -> bool:
    from sglang_dspark_dp import adapter

    return adapter.folded_site() is not None


# --------------------------------------------------------------------------
# Startup: the draft capture decision.
# --------------------------------------------------------------------------


def _startup() -> tuple[str, type, str, Any]:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers.worker import RecordedReadings

    module, cls = adapter.load_worker()

    def watch_capture_decision(original: Any, worker: Any, *args: Any, **kwargs: Any):
        if not adapter.hosts_draft(worker):
            return original(worker, *args, **kwargs)
        found = adapter.capture_group(worker)
        draft = adapter.draft_worker_of(worker)
        if found is None or draft is None:
            return original(worker, *args, **kwargs)
        ch = watch.channel(found[0])
        if ch is None:
            return original(worker, *args, **kwargs)
        changes = (
            ("capture-group-memory",)
            if adapter.dp_attention_on(worker)
            else ("spec-tp-sync",)
        )
        recorded = RecordedReadings(adapter.memory_helper_sites(module, worker))
        capture_graphs = getattr(draft, adapter.DRAFT_INIT_GRAPHS)

        def read_text() -> str:
            read = recorded.readings[0].value if recorded.readings else None
            return "" if read is None else f" (read {read:.2f} GiB free)"

        folded_at = adapter.folded_site()
        folded: list[bool] = []  # what the draft sampler's build decided

        def checked(*a: Any, **k: Any) -> Any:
            capture = adapter.capture_decision(a, k)
            events = [
                watch.Event(
                    CAPTURE,
                    STARTUP,
                    capture,
                    f"capture={capture}{read_text()}",
                    changes,
                )
            ]
            if folded_at is not None:
                value = folded[-1] if folded else None
                shown = "not taken" if value is None else f"folded={value}"
                events.append(watch.Event(FOLDED, STARTUP, value, shown, changes))
            # Both before the draft worker's capture barriers (the folded
            # buffers are baked into the graphs it captures); the capture
            # decision first, as it decides whether there is a folded one.
            ch.check_now(*events)
            return capture_graphs(*a, **k)

        swaps = [(draft, adapter.DRAFT_INIT_GRAPHS, checked)]
        if folded_at is not None:
            decide = getattr(*folded_at)

            @functools.wraps(decide)  # its signature, for every caller
            def recording_folded(*a: Any, **k: Any) -> Any:
                value = decide(*a, **k)
                folded.append(bool(value))
                return value

            swaps.append((*folded_at, recording_folded))
        with recorded, adapter.AttrSwap(*swaps):
            return original(worker, *args, **kwargs)

    return adapter.STARTUP_TARGET, cls, adapter.INIT_GRAPHS, watch_capture_decision


# --------------------------------------------------------------------------
# Compact verify: budget, broadcast entry, graph tier.
# --------------------------------------------------------------------------


def _verify() -> tuple[str, type, str, Any]:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.adapter import planner as sg_planner
    from sglang_dspark_dp.outcome import DidNotEnable

    module, cls = sg_planner.load_planner()
    shape = sg_planner.group_shape(module)
    if shape is None:
        raise DidNotEnable(
            "this build's planner runs no verify_lens broadcast (no group whose "
            "ranks must agree on these decisions)"
        )
    # Per planner, found at its first step: its group, the group's watch
    # and the changes its decisions belong to (overlap is set at startup).
    found: dict[int, tuple[Any, Any, tuple[str, ...]]] = {}

    def group_of(planner: Any) -> tuple[Any, Any, tuple[str, ...]]:
        key = id(planner)
        if key not in found:
            group = ch = None
            try:
                group = sg_planner.broadcast_group(planner, module, shape)
            except Exception:
                group = None
            if group is not None:
                ch = watch.channel(sg_planner.group_object(group))
            changes = (
                ("verify-budget-broadcast", "relay-wait")
                if sg_planner.overlap_on(planner, module)
                else ("verify-budget-broadcast",)
            )
            found[key] = (group, ch, changes)
        return found[key]

    def watch_verify_decisions(original: Any, planner: Any, *args: Any, **kwargs: Any):
        group, ch, changes = group_of(planner)
        if ch is None:
            return original(planner, *args, **kwargs)
        step = ch.next_step(VERIFY_BUDGET)
        budget = kwargs.get("budget")
        ch.note(watch.Event(VERIFY_BUDGET, step, budget, f"budget={budget}", changes))
        entered: list[bool] = []
        target = sg_planner.group_object(group)
        broadcast = getattr(target, sg_planner.GROUP_BROADCAST)

        def entering(*a: Any, **k: Any) -> Any:
            if not entered:
                entered.append(True)
                ch.note(watch.Event(VERIFY_BROADCAST, step, True, "entered", changes))
            return broadcast(*a, **k)

        with adapter.AttrSwap((target, sg_planner.GROUP_BROADCAST, entering)):
            layout = original(planner, *args, **kwargs)
        if not entered:
            ch.note(
                watch.Event(VERIFY_BROADCAST, step, False, "did not enter", changes)
            )
        tier = sg_planner.layout_tier(layout)
        shown = "no compact layout" if tier is None else f"tier={tier} tokens"
        ch.note(watch.Event(VERIFY_TIER, step, tier, shown, changes))
        return layout

    return sg_planner.LAYOUT_TARGET, cls, sg_planner.LAYOUT, watch_verify_decisions


# --------------------------------------------------------------------------
# The draft batch: DP sync sizes and graph admission.
# --------------------------------------------------------------------------


def _draft() -> tuple[str, type, str, Any]:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
        DraftDPFieldNames,
    )

    api = adapter.load_sglang_api()
    names = DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)
    fields = (("DP sync sizes", names.scaled_cpu), ("graph flag", names.dp_graph_ok))
    missing = [what for what, field in fields if field is None]
    if missing:
        raise DidNotEnable(
            f"this build's ForwardBatch declares no {' or '.join(missing)} field"
        )
    changes = ("dp-draft-metadata",)
    found: dict[int, Any] = {}

    def channel_of(proposer: Any) -> Any:
        key = id(proposer)
        if key not in found:
            group = adapter.sync_group(proposer)
            found[key] = None if group is None else watch.channel(group)
        return found[key]

    def listed(value: Any) -> tuple[int, ...] | None:
        return None if value is None else tuple(int(v) for v in value)

    def watch_draft_decisions(
        original: Any, proposer: Any, forward_batch: Any, batch: Any, *a: Any, **k: Any
    ):
        result = original(proposer, forward_batch, batch, *a, **k)
        if not adapter.takes_dp_sync(proposer, batch):
            return result
        ch = channel_of(proposer)
        if ch is None:
            return result
        step = ch.next_step(DRAFT_SIZES)
        scaled = listed(getattr(forward_batch, names.scaled_cpu, None))
        logprob = (
            None
            if names.scaled_logprob_cpu is None
            else listed(getattr(forward_batch, names.scaled_logprob_cpu, None))
        )
        raw = (
            None
            if names.unscaled is None
            else listed(getattr(forward_batch, names.unscaled, None))
        )

        def shown() -> str:
            counts = list(raw) if raw is not None else None
            return (
                f"sizes={list(scaled or ())} for logprobs={list(logprob or ())}"
                f" (per-rank counts {counts})"
            )

        ch.note(watch.Event(DRAFT_SIZES, step, (scaled, logprob, raw), shown, changes))
        graph = bool(getattr(forward_batch, names.dp_graph_ok, False))
        ch.note(
            watch.Event(
                DRAFT_ADMISSION,
                step,
                graph,
                "CUDA graph" if graph else "eager",
                changes,
            )
        )
        return result

    return adapter.TARGET, api.proposer_cls, adapter.FILL, watch_draft_decisions


# --------------------------------------------------------------------------
# The worker's step entry: the scheduler's call reaching its body.
# --------------------------------------------------------------------------


def _entry() -> tuple[str, type, str, Any]:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.adapter import worker as sg_worker
    from sglang_dspark_dp.outcome import DidNotEnable

    _, cls = adapter.load_worker()
    if not callable(cls.__dict__.get(sg_worker.FORWARD)):
        raise DidNotEnable(f"this build's {cls.__name__} has no {sg_worker.FORWARD}")
    bodies = tuple(name for name in sg_worker.STEP_BODIES if hasattr(cls, name))
    changes = ("non-overlap-pp-proxy",)
    found: dict[int, Any] = {}

    def channel_of(worker: Any) -> Any:
        key = id(worker)
        if key not in found:
            group = sg_worker.step_group(worker)
            found[key] = None if group is None else watch.channel(group)
        return found[key]

    def watch_worker_entry(original: Any, worker: Any, *args: Any, **kwargs: Any):
        if not adapter.hosts_draft(worker):
            return original(worker, *args, **kwargs)
        ch = channel_of(worker)
        if ch is None:
            return original(worker, *args, **kwargs)
        step = ch.next_step(ENTRY)
        passed = tuple(sorted(kwargs))
        reached: list[bool] = []

        def note(ok: bool, how: str) -> None:
            reached.append(ok)
            ch.note(
                watch.Event(
                    ENTRY,
                    step,
                    (passed, ok),
                    lambda: f"{how} (keywords passed: {list(passed) or 'none'})",
                    changes,
                )
            )

        def reaching(body: Any) -> Any:
            def into_the_body(*a: Any, **k: Any) -> Any:
                if not reached:
                    note(True, "reached the worker's body")
                return body(*a, **k)

            return into_the_body

        swaps = []
        for name in bodies:
            try:
                swaps.append((worker, name, reaching(getattr(worker, name))))
            except Exception:  # an instance without it never runs it
                continue
        try:
            with adapter.AttrSwap(*swaps):
                result = original(worker, *args, **kwargs)
        except Exception as exc:
            if not reached:
                note(False, f"refused at the call: {type(exc).__name__}: {exc}")
            raise
        if not reached:
            note(False, "returned without reaching the worker's body")
        return result

    return sg_worker.FORWARD_TARGET, cls, sg_worker.FORWARD, watch_worker_entry


SITES: tuple[Site, ...] = (
    Site(
        "startup",
        WORKER_MODULE,
        _startup,
        (CAPTURE, FOLDED),
        {FOLDED: _folded_taken},
    ),
    Site(
        "compact-verify",
        PLANNER_MODULE,
        _verify,
        (VERIFY_BUDGET, VERIFY_BROADCAST, VERIFY_TIER),
    ),
    Site("draft-batch", DRAFT_MODULE, _draft, (DRAFT_SIZES, DRAFT_ADMISSION)),
    Site("worker-entry", WORKER_MODULE, _entry, (ENTRY,)),
)


def instrument(*, apply: bool = True) -> list[str]:
    """Hook every site whose SGLang module is imported (and not hooked
    yet); returns their names. A site that cannot be hooked says so in
    one line (its decisions go unwatched). ``apply=False``: registered
    only (the caller applies the hooks)."""
    from sglang_dspark_dp import adapter

    hooked = []
    for site in SITES:
        if site.hooked is not None or site.module not in sys.modules:
            continue
        try:
            target, owner, attr, around = site.build()
            stock = adapter.add_around(target, around, owner, attr)
        except Exception as exc:
            logger.warning(
                "sglang-dspark-dp: watch: cannot watch the %s decisions on this "
                "build (%s: %s); they go unwatched",
                site.name,
                type(exc).__name__,
                exc,
            )
            continue
        site.hooked = (target, owner, attr, around, stock)
        hooked.append(site.name)
    if hooked and apply:
        adapter.apply_hooks()
    return hooked


def uninstrument() -> None:
    """Take every site's hook off (the other hooks on its method stay)."""
    from sglang_dspark_dp import adapter

    for site in SITES:
        if site.hooked is None:
            continue
        target, owner, attr, around, stock = site.hooked
        adapter.remove_hook(target, around, owner, attr, stock)
        site.hooked = None


def survey() -> list[dict[str, Any]]:
    """Each site on this build, hooked or not: its decisions and whether
    its hook can be built here (``reason`` says why not). Builds the hooks
    without registering them (imports the sites' modules)."""
    out = []
    for site in SITES:
        reason = None
        decisions = list(site.decisions)
        try:
            if site.hooked is None:
                importlib.import_module(site.module)
                site.build()
            decisions = site.decisions_here()
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
        out.append(
            {
                "site": site.name,
                "decisions": decisions,
                "watchable": reason is None,
                "hooked": site.hooked is not None,
                "reason": reason,
            }
        )
    return out


def hooked() -> list[str]:
    """The sites hooked in this process."""
    return [site.name for site in SITES if site.hooked is not None]


def load_site_modules() -> None:
    """Import every site's SGLang module (tools that instrument at once)."""
    for site in SITES:
        importlib.import_module(site.module)
