"""One scheduler step with the overlap schedule off, up to the DSpark
worker: the installed ``Scheduler.run_batch`` on a stand-in scheduler.

``run_batch`` is SGLang's own; what stands in is the scheduler's state (the
overlap schedule off, no pipeline, no PD disaggregation, no profiler), the
batch (a prefill or a decode step of the DSpark algorithm, no requests) and
the worker instance: the installed ``DSparkWorkerV2.forward_batch_generation``
(as the class holds it now, hooked or not) runs on a stand-in whose prefill
and decode bodies stop the step by raising :class:`Reached`. So a step
either reaches the worker's body, or fails the way the server would at the
call (a ``TypeError`` for an argument the worker does not take), or cannot
be driven (:class:`CannotDrive`, naming what the scheduler read).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.adapter.scheduler import (
    FORWARD_ISOLATION,
    SCHED_IDLED,
    no_input_resolution,
)
from sglang_dspark_dp.adapter.worker import (
    FORWARD,
    HOSTS_DRAFT,
    STEP_COLLABORATORS,
    STEP_METHODS,
    STEP_SWITCHES_OFF,
)


class Reached(Exception):
    """The step reached the worker's prefill or decode body."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class CannotDrive(RuntimeError):
    """The stand-in does not carry something the installed code read."""


class _Absorb:
    """Answers every method call with None (planner and observer no-ops)."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None


class _StandIn:
    """Holds what is set; reading anything else names it (CannotDrive)."""

    _what = "stand-in"

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise CannotDrive(f"the {self._what} has no {name!r}, which SGLang read")


class StandInWorker(_StandIn):
    _what = "stand-in DSpark worker"

    def __init__(self) -> None:
        setattr(self, HOSTS_DRAFT, True)
        for name in STEP_COLLABORATORS:
            setattr(self, name, _Absorb())
        for name in STEP_SWITCHES_OFF:
            setattr(self, name, False)
        for path, method in STEP_METHODS.items():
            setattr(self, method, functools.partial(_reach, path))


def _reach(path: str, *args: Any, **kwargs: Any) -> Any:
    raise Reached(path)


class StandInScheduler(_StandIn):
    _what = "stand-in scheduler"

    def __init__(self, worker_cls: type, worker: Any) -> None:
        self.forward_ct = 0
        setattr(self, SCHED_IDLED, False)
        setattr(self, FORWARD_ISOLATION, _no_isolation)
        self.scripted_scheduler_hook = None
        self.profiler_manager = _Absorb()
        self.scheduler_stage_metrics = None  # stage metrics off
        self.metrics_reporter = _Absorb()
        self.processed_tokens_counter = 0
        self.forward_sleep_time = None
        self.disaggregation_mode = None  # neither prefill nor decode side
        self.is_generation = True
        self.enable_overlap = False  # --disable-overlap-schedule
        self.enable_pdmux = False
        self.enable_unified_memory = False
        self.enable_dp_attention = False
        self.future_map = None
        self.pp_group = SimpleNamespace(is_last_rank=True, world_size=1)
        self.ps = SimpleNamespace(pp_size=1)
        #: The keyword arguments of each call the scheduler made.
        self.keywords: list[tuple[str, ...]] = []

        def forward(*args: Any, **kwargs: Any) -> Any:
            self.keywords.append(tuple(sorted(kwargs)))
            # Looked up on the class at call time, so an applied hook is in it.
            return getattr(worker_cls, FORWARD)(worker, *args, **kwargs)

        self.model_worker = SimpleNamespace(**{FORWARD: forward})


def _no_isolation(batch: Any, overlap: bool = False) -> Any:
    return contextlib.nullcontext()


def step_batch(forward_mode: Any, spec_algorithm: Any, *, prefill: bool) -> Any:
    """A DSpark batch of one step and no requests."""
    mode = forward_mode.EXTEND if prefill else forward_mode.DECODE
    return SimpleNamespace(
        forward_mode=mode,
        is_extend_in_batch=prefill,
        spec_algorithm=spec_algorithm,
        reqs=[],
        extend_num_tokens=0,
        spec_info=None,
        return_logprob=False,
        return_hidden_states=False,
    )


@dataclasses.dataclass(frozen=True)
class StepOutcome:
    """What one non-overlap step did."""

    step: str  # "prefill" | "decode"
    reached: str | None  # the worker body reached (None: it was not)
    error: str | None  # the server's exception at the call, if any
    #: The keyword arguments the scheduler passed the worker.
    keywords: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.reached == self.step


def non_overlap_step(
    api: Any,
    scheduler_module: Any,
    scheduler_cls: type,
    worker_cls: type,
    *,
    prefill: bool,
    worker: StandInWorker | None = None,
) -> StepOutcome:
    """Run ``Scheduler.run_batch`` once, overlap off, on stand-ins (one
    rank, one pipeline stage, through ``get_parallel().override``; a fresh
    :class:`StandInWorker` unless ``worker`` is given); raises
    :class:`CannotDrive` when the installed code reads what is not there."""
    from sglang_dspark_dp.adapter.parallel import parallel_override
    from sglang_dspark_dp.adapter.scheduler import RUN_BATCH

    step = "prefill" if prefill else "decode"
    scheduler = StandInScheduler(worker_cls, worker or StandInWorker())
    batch = step_batch(api.forward_mode, api.spec_algorithm.DSPARK, prefill=prefill)
    run_batch = getattr(scheduler_cls, RUN_BATCH)
    try:
        with (
            parallel_override(api.get_parallel, dp_size=1),
            no_input_resolution(scheduler_module),
        ):
            run_batch(scheduler, batch)
    except Reached as reached:
        return StepOutcome(step, reached.path, None, _passed(scheduler))
    except CannotDrive:
        raise
    except TypeError as exc:
        return StepOutcome(step, None, f"TypeError: {exc}", _passed(scheduler))
    except Exception as exc:
        raise CannotDrive(
            f"{RUN_BATCH} failed before the worker: {type(exc).__name__}: {exc}"
        ) from exc
    raise CannotDrive(f"{RUN_BATCH} returned without calling the DSpark worker")


def _passed(scheduler: StandInScheduler) -> tuple[str, ...]:
    return tuple(sorted({k for call in scheduler.keywords for k in call}))
