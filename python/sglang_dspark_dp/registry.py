"""The registry of repairs and the base every repair is built on.

A repair (one module each, mirroring the SGLang module it patches) defines
``REPAIR``, an instance of a :class:`Repair` subclass. Like Sentry's
integrations, :meth:`Repair.setup_once` probes the installed SGLang and
either returns the hook to register, returns None (nothing to repair), or
raises :class:`DidNotEnable`; like OpenTelemetry's instrumentors,
``instrument``/``uninstrument`` are symmetric and idempotent. The module
functions walk every repair; the CLI and the harnesses instrument at once
(they import what they judge), and every caller prints from the returned
:class:`Status`. ``register()`` (the plugin's entry point) only
arms them (:func:`arm`): each repair is instrumented when the SGLang module that
arms it is first imported (:mod:`sglang_dspark_dp.imports`), so a process
that never imports DSpark runs no probe and imports nothing of SGLang's.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from sglang_dspark_dp import imports
from sglang_dspark_dp.adapter.modules import (
    DRAFT_MODULE,
    PLANNER_MODULE,
    SYNC_MODULE,
    WORKER_MODULE,
)
from sglang_dspark_dp.isolation import probing
from sglang_dspark_dp.outcome import DidNotEnable, Outcome, Status

logger = logging.getLogger("sglang_dspark_dp")

#: Every repair: its name and the module that defines ``REPAIR``.
REPAIRS: tuple[tuple[str, str], ...] = (
    (
        "draft-batch",
        "sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft",
    ),
    (
        "startup-capture",
        "sglang_dspark_dp.srt.speculative.dspark_components.dspark_worker_v2",
    ),
    ("capture-group-memory", "sglang_dspark_dp.srt.speculative.spec_tp_sync"),
    ("non-overlap-entry", "sglang_dspark_dp.srt.managers.scheduler"),
    (
        "verify-budget",
        "sglang_dspark_dp.srt.speculative.dspark_components.dspark_planner",
    ),
    ("relay-wait", "sglang_dspark_dp.srt.managers.overlap_utils"),
)

#: The SGLang module whose first import in a process arms each repair: the
#: module it patches, except relay-wait's, whose ConfidenceRelay lives in
#: the scheduler's overlap module, which every process that runs the HTTP
#: server imports too; it is armed by its one user, DSpark's planner.
ARMED_BY: dict[str, str] = {
    "draft-batch": DRAFT_MODULE,
    "startup-capture": WORKER_MODULE,
    "capture-group-memory": SYNC_MODULE,
    "non-overlap-entry": WORKER_MODULE,
    "verify-budget": PLANNER_MODULE,
    "relay-wait": PLANNER_MODULE,
}
#: Where DSpark runs: once its worker's module is imported, every repair
#: not tried yet is tried, so one whose module this build lacks (SpecTpSync
#: before 0.5.19) still says so in its line.
DSPARK_RUNS = WORKER_MODULE


@dataclasses.dataclass(frozen=True)
class Hook:
    """What a repair registers: an AROUND hook on ``owner.attr``."""

    target: str  # HookRegistry's dotted name of owner.attr
    owner: type
    attr: str
    around: Callable[..., Any]
    reason: str  # the status line's reason when enabled
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: ``(module, name, value)``: names the installed module lacks that the
    #: repaired code answers to, offered there while instrumented (e.g. a
    #: function a later release imports into the patched module, so that a
    #: ``mock.patch`` on it, written for that release, reaches the repair).
    offers: tuple[tuple[Any, str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class NotNeeded:
    """``setup_once``'s answer when the installed SGLang is already right."""

    reason: str
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


class Repair:
    """Base of every repair; subclasses set ``name``, ``stands_in_for`` and
    ``setup_once``."""

    name = "repair"
    #: The upstream changes (:mod:`sglang_dspark_dp.upstream` keys) this
    #: repair makes where a build lacks them.
    stands_in_for: tuple[str, ...] = ()

    def __init__(self) -> None:
        self._hook: Hook | None = None
        self._original: Any = None
        self._offered: list[tuple[Any, str, Any]] = []
        self._verdicts: tuple[Any, ...] = ()
        self._status = Status(self.name, Outcome.NOT_INSTRUMENTED, "not tried yet")

    def found(self, verdicts: Any) -> None:
        """What the probe found of the upstream changes this repair stands
        in for (set by ``setup_once`` as soon as it knows, so that every
        outcome, 'not applicable' included, names them)."""
        self._verdicts = tuple(verdicts)

    @property
    def verdicts(self) -> tuple[Any, ...]:
        return self._verdicts

    # -- what a subclass provides -------------------------------------

    def setup_once(self) -> Hook | NotNeeded:
        """Probe the installed SGLang; raise DidNotEnable if it cannot."""
        raise NotImplementedError

    def stock_verdicts(self) -> tuple[Any, ...]:
        """Probe the installed SGLang as it stands without this repair's
        hook and say what it found of the changes this repair stands in for
        (:class:`sglang_dspark_dp.upstream.Verdict`; empty where another
        repair judges them on this release). Raises DidNotEnable where it
        cannot probe. ``judge`` asks every repair, with the plugin off."""
        raise NotImplementedError

    def agreement_hook(self, why: str) -> Hook | None:
        """For a repair whose hook enters a collective: the hook to register
        when this rank's probe failed for a reason other ranks may not share
        (an unexpected exception), carrying that failed verdict so the group
        agrees to run stock together (see :mod:`sglang_dspark_dp.consensus`).
        None (the default): the repair adds no collective."""
        return None

    # -- shared -----------------------------------------------------------

    @property
    def instrumented(self) -> bool:
        return self._hook is not None

    @property
    def original(self) -> Any:
        """The stock method the hook replaced (None: not instrumented)."""
        return self._original

    def status(self) -> Status:
        return self._status

    def _set(self, outcome: Outcome, reason: str, detail=None) -> Status:
        from sglang_dspark_dp.package import installed_sglang_version

        self._status = Status(
            self.name,
            outcome,
            reason,
            installed_sglang_version(),
            dict(detail or {}),
            self._verdicts,
        )
        return self._status

    def instrument(self, *, apply: bool = True) -> Status:
        """Probe and register the hook; never raises. ``apply=False`` only
        registers (``load_plugins()`` applies every plugin's hooks itself).
        Calling it again while instrumented returns the current status."""
        from sglang_dspark_dp import adapter

        if self._hook is not None:
            return self._status
        self._verdicts = ()
        failed: str | None = None
        try:
            try:
                with probing():
                    answer = self.setup_once()
            except DidNotEnable:
                raise
            except Exception as exc:
                failed = f"its probe failed: {type(exc).__name__}: {exc}"
                fallback = self.agreement_hook(failed)
                if fallback is None:
                    raise
                answer = fallback
            if isinstance(answer, NotNeeded):
                return self._set(Outcome.NOT_NEEDED, answer.reason, answer.detail)
            if adapter.is_patched(answer.target):
                raise DidNotEnable(
                    f"{answer.target} was already patched before this plugin loaded"
                )
            self._original = answer.owner.__dict__[answer.attr]
            adapter.register_around(answer.target, answer.around)
            self._hook = answer
            for module, name, value in answer.offers:
                if not hasattr(module, name):
                    setattr(module, name, value)
                    self._offered.append((module, name, value))
            if apply:
                adapter.apply_hooks()
        except DidNotEnable as exc:
            return self._set(Outcome.NOT_APPLICABLE, str(exc))
        except Exception as exc:  # never crash a server over a repair
            return self._set(
                Outcome.NOT_APPLICABLE,
                f"could not be set up: {type(exc).__name__}: {exc}",
            )
        if failed is not None:
            return self._set(Outcome.NOT_APPLICABLE, answer.reason, answer.detail)
        return self._set(Outcome.ENABLED, answer.reason, answer.detail)

    def uninstrument(self) -> None:
        """Undo :meth:`instrument` (no-op when not instrumented)."""
        from sglang_dspark_dp import adapter

        hook = self._hook
        if hook is None:
            return
        adapter.remove_hook(
            hook.target, hook.around, hook.owner, hook.attr, self._original
        )
        while self._offered:
            module, name, value = self._offered.pop()
            if vars(module).get(name) is value:
                delattr(module, name)
        self._hook = None
        self._original = None
        self._set(Outcome.NOT_INSTRUMENTED, "uninstrumented")


def repair(name: str) -> Repair:
    """The registered repair called ``name`` (imports its module)."""
    for known, module in REPAIRS:
        if known == name:
            return importlib.import_module(module).REPAIR
    raise KeyError(f"no repair named {name!r} (known: {', '.join(names())})")


def names() -> list[str]:
    return [name for name, _ in REPAIRS]


def repairs() -> list[Repair]:
    """Every repair whose module loads (imports them)."""
    return [r for r in _each() if isinstance(r, Repair)]


def _unavailable(reason: str) -> list[Status]:
    return [Status(name, Outcome.NOT_APPLICABLE, reason) for name in names()]


def _each() -> list[Repair | Status]:
    """Every repair, or the status saying why its module cannot load."""
    out: list[Repair | Status] = []
    for name in names():
        try:
            out.append(repair(name))
        except Exception as exc:
            out.append(
                Status(
                    name,
                    Outcome.NOT_APPLICABLE,
                    f"could not be loaded: {type(exc).__name__}: {exc}",
                )
            )
    return out


def instrument(*, apply: bool = True) -> list[Status]:
    """Instrument every repair; one status each. Never raises."""
    from sglang_dspark_dp.package import missing_runtime

    missing = missing_runtime()
    if missing is not None:
        return _unavailable(missing)
    out = [r.instrument(apply=False) if isinstance(r, Repair) else r for r in _each()]
    if apply and any(s.enabled for s in out):
        from sglang_dspark_dp import adapter

        adapter.apply_hooks()
    return out


def uninstrument() -> None:
    """Uninstrument every repair that is instrumented."""
    from sglang_dspark_dp.package import missing_runtime

    if missing_runtime() is not None:
        return
    for r in reversed(_each()):
        if isinstance(r, Repair):
            r.uninstrument()


def status() -> list[Status]:
    """Every repair's current status (without instrumenting anything)."""
    from sglang_dspark_dp.package import missing_runtime

    missing = missing_runtime()
    if missing is not None:
        return _unavailable(missing)
    return [r.status() if isinstance(r, Repair) else r for r in _each()]


class _Arming:
    """One :func:`arm`: the repairs it has tried and where it reports."""

    def __init__(self, report: Callable[[list[Status]], None]) -> None:
        self.report = report
        self.tried: set[str] = set()
        self.lock = threading.Lock()

    def settle(self, _module: Any = None) -> None:
        """Instrument, in the registry's order, every repair not tried yet
        whose arming module (or DSpark's worker) is imported now."""
        import sys

        runs = DSPARK_RUNS in sys.modules
        with self.lock:
            due = [
                name
                for name in names()
                if name not in self.tried and (runs or ARMED_BY[name] in sys.modules)
            ]
            self.tried.update(due)
        if not due:
            if self.watch():
                from sglang_dspark_dp import adapter

                adapter.apply_hooks()
            return
        out = []
        for name in due:
            try:
                out.append(repair(name).instrument(apply=False))
            except Exception as exc:  # the repair's module cannot load
                out.append(
                    Status(
                        name,
                        Outcome.NOT_APPLICABLE,
                        f"could not be loaded: {type(exc).__name__}: {exc}",
                    )
                )
        watched = self.watch()  # outside the repairs just hooked
        if any(s.enabled for s in out) or watched:
            from sglang_dspark_dp import adapter

            adapter.apply_hooks()
        self.report(out)

    def watch(self) -> list[str]:
        """Where the watch is on: register its sites whose module is
        imported now (after the repairs of the same module, so they see
        the repaired decisions); applied with them. Off: nothing."""
        from sglang_dspark_dp import watch

        if not watch.enabled():
            return []
        from sglang_dspark_dp import watch_sites

        watch.tell_repairs(repairs)
        with self.lock:
            return watch_sites.instrument(apply=False)


def arm(report: Callable[[list[Status]], None]) -> dict[str, str]:
    """Arm every repair: each is instrumented (probe, hook registered and
    applied) when its arming module (:data:`ARMED_BY`) is first imported in
    this process, after the import that brings it in settles, and its
    status goes to ``report``; a module imported already arms it now.
    Returns each repair's arming module. Imports nothing of SGLang's."""
    arming = _Arming(report)
    for module in dict.fromkeys([*ARMED_BY.values(), DSPARK_RUNS]):
        imports.when_imported(module, arming.settle)
    return dict(ARMED_BY)
