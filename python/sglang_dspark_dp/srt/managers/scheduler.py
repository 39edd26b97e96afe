"""The non-overlap entry repair: the scheduler's call reaches the DSpark
worker with ``--disable-overlap-schedule``.

Counterpart of ``sglang/srt/managers/scheduler.py`` (SGLang issue #39262).
With the overlap schedule off, ``Scheduler.run_batch``'s speculative branch
calls ``model_worker.forward_batch_generation(batch, pp_proxy_tensors=...)``
on some releases whose ``DSparkWorkerV2.forward_batch_generation`` does not
take that keyword (0.5.19 and 0.5.20): every step, prefill included, raises
``TypeError`` and the server dies on its first request. DSpark runs with one
pipeline stage, so the argument is always None there.

The fix sits on the callee, the one place both sides meet: an AROUND hook
on ``DSparkWorkerV2.forward_batch_generation`` that drops
``pp_proxy_tensors`` when it is None and refuses anything else with a clear
error (a DSpark worker has no pipeline stages to hand tensors to). It adds
no collective and costs a dict lookup per step.

Nothing is decided by version string: the probe runs the installed
``Scheduler.run_batch`` with the overlap schedule off on a stand-in
scheduler (:mod:`sglang_dspark_dp.drivers.scheduler`), a prefill and a
decode step, up to the installed worker method. If both reach the worker's
body, the release needs nothing. If the call fails with the ``TypeError``
the server would raise, the repair is enabled, after the same steps are run
again through the hook and reach the body.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter.base import AttrSwap
from sglang_dspark_dp.adapter.scheduler import PP_KWARG, load_scheduler
from sglang_dspark_dp.adapter.worker import FORWARD, FORWARD_TARGET
from sglang_dspark_dp.drivers.scheduler import (
    CannotDrive,
    StepOutcome,
    non_overlap_step,
)
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.upstream import State, Verdict

CHANGE = "non-overlap-pp-proxy"


class PipelineTensorsError(ValueError):
    """A DSpark worker was handed pipeline tensors it has no stage for."""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Where a non-overlap prefill and decode step got to."""

    steps: tuple[StepOutcome, ...]

    @property
    def reaches(self) -> bool:
        return all(s.ok for s in self.steps)

    @property
    def rejects_pp_kwarg(self) -> bool:
        return any(s.error and PP_KWARG in s.error for s in self.steps)

    @property
    def passes_pp_kwarg(self) -> bool:
        """The scheduler's call hands the worker ``pp_proxy_tensors``."""
        return any(PP_KWARG in s.keywords for s in self.steps)

    def describe(self) -> str:
        return "; ".join(
            f"{s.step}: " + ("reaches the worker" if s.ok else (s.error or "-"))
            for s in self.steps
        )


@isolated
def probe(api: Any = None) -> ProbeResult:
    """Drive one non-overlap prefill and decode step through the installed
    scheduler to the installed worker (as the class holds it now)."""
    api = api or adapter.load_sglang_api()
    module, cls = load_scheduler()
    _, worker_cls = adapter.load_worker()
    try:
        steps = tuple(
            non_overlap_step(api, module, cls, worker_cls, prefill=prefill)
            for prefill in (True, False)
        )
    except CannotDrive as exc:
        raise DidNotEnable(
            f"could not drive the installed Scheduler.run_batch (overlap off) "
            f"on a stand-in: {exc}"
        ) from exc
    return ProbeResult(steps)


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    """What the probe found of the change that fixed #39262."""
    if not result.passes_pp_kwarg and result.reaches:
        state, text = (
            State.NOT_AFFECTED,
            f"the scheduler's non-overlap call passes no {PP_KWARG}",
        )
    elif result.reaches:
        state, text = (
            State.IN,
            f"the DSpark worker takes the {PP_KWARG} the scheduler passes",
        )
    else:
        state, text = (
            State.NOT_IN,
            f"with --disable-overlap-schedule every step raises: {result.describe()}",
        )
    return (Verdict(CHANGE, state, text),)


def accept_pp_proxy_tensors(original: Any, worker: Any, *args: Any, **kwargs: Any):
    """The AROUND hook: ``pp_proxy_tensors=None`` is dropped; anything else
    is refused, naming the argument and its value."""
    if PP_KWARG in kwargs:
        value = kwargs.pop(PP_KWARG)
        if value is not None:
            raise PipelineTensorsError(
                f"DSparkWorkerV2.{FORWARD} got {PP_KWARG}={type(value).__name__} "
                "(pipeline tensors); DSpark runs with one pipeline stage "
                "(--pp-size 1), so there is no stage to hand them to"
            )
    return original(worker, *args, **kwargs)


class NonOverlapEntryRepair(Repair):
    """Lets the scheduler's non-overlap call reach the DSpark worker."""

    name = "non-overlap-entry"
    stands_in_for = (CHANGE,)

    def __init__(self) -> None:
        super().__init__()
        self.probe_result: ProbeResult | None = None

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        return verdicts(probe())

    def setup_once(self) -> Hook | NotNeeded:
        adapter.hook_registry()  # DidNotEnable without SGLang's plugin API
        _, worker_cls = adapter.load_worker()
        stock = probe()
        self.probe_result = stock
        self.found(verdicts(stock))
        detail = {"target": FORWARD_TARGET, "stock": stock.describe()}
        if stock.reaches:
            return NotNeeded(
                "with --disable-overlap-schedule the scheduler's call reaches "
                "the DSpark worker; nothing patched",
                detail,
            )
        if not stock.rejects_pp_kwarg:
            raise DidNotEnable(
                "with --disable-overlap-schedule the scheduler's call fails in a "
                f"way this repair does not address ({stock.describe()})"
            )
        original = worker_cls.__dict__[FORWARD]

        def through_the_hook(worker: Any, *args: Any, **kwargs: Any) -> Any:
            return accept_pp_proxy_tensors(original, worker, *args, **kwargs)

        with AttrSwap((worker_cls, FORWARD, through_the_hook)):
            check = probe()
        if not check.reaches:
            raise DidNotEnable(
                f"the hook does not let the call through ({check.describe()})"
            )
        detail["repaired"] = check.describe()
        return Hook(
            target=FORWARD_TARGET,
            owner=worker_cls,
            attr=FORWARD,
            around=accept_pp_proxy_tensors,
            reason=(
                "with --disable-overlap-schedule every step would raise TypeError "
                f"(the scheduler passes {PP_KWARG}, which DSparkWorkerV2."
                f"{FORWARD} does not take); dropping it when None"
            ),
            detail=detail,
        )


REPAIR = NonOverlapEntryRepair()
