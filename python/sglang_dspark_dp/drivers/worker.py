"""A stand-in DSpark worker for ``init_cuda_graphs``, and the recorder of its
free-memory readings: probe and harness material, no model behind it.

Every method the stand-in offers to SGLang takes the arguments of the
installed method it stands in for: its signature is read from the installed
class when the stand-in is built (:func:`following`), so a release that
passes a new argument reaches the stand-in's behaviour instead of a
``TypeError`` the real callee would never raise, and a call the real one
would reject is rejected the same way.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.adapter.base import AttrSwap, signature_of
from sglang_dspark_dp.adapter.worker import (
    CAPTURE_GROUP_ATTR,
    DECODE_GRAPH_ALLOWED,
    DEFERRED_COMMIT,
    DRAFT_CONTEXT,
    DRAFT_DP_CONTEXT_ENABLED,
    DRAFT_SAMPLER,
    DRAFT_SAMPLER_BUILDER,
    DRAFT_WORKER_ATTR,
    HOSTS_DRAFT,
    MEMORY_HELPER,
    PROPOSER_ATTR,
    TP_SYNC_ATTR,
    decide_folded,
    draft_worker_class,
    folded_decision,
    init_reads,
    proposer_class,
)

#: The stand-in draft model's folded-sampling buffers: the installed
#: decision finds them needing this many GiB (draft width 4, 128 requests,
#: bf16 logits), so a rank with less than this plus SGLang's headroom free
#: decides against folded sampling.
FOLDED_NEED_GIB = 1.0
FOLDED_GAMMA, FOLDED_MAX_BS = 4, 128
_BYTES_PER_VOCAB_ENTRY = FOLDED_MAX_BS * 4 + FOLDED_MAX_BS * FOLDED_GAMMA * 2


def folded_model() -> Any:
    """A draft model stand-in with what the folded-sampling decision reads:
    the LM head's vocabulary size and its (empty, bf16) weight, and a Markov
    head that is not the sharded-greedy kind."""
    import torch

    vocab = int(FOLDED_NEED_GIB * (1 << 30)) // _BYTES_PER_VOCAB_ENTRY
    return SimpleNamespace(
        lm_head=SimpleNamespace(
            org_vocab_size=vocab, weight=torch.empty(0, dtype=torch.bfloat16)
        ),
        markov_head=SimpleNamespace(),  # a plain head (no sharded greedy)
    )


def following(sig: inspect.Signature | None, impl: Callable[[Any], Any]) -> Any:
    """A callable that accepts exactly what ``sig`` accepts (raising the
    ``TypeError`` the real callee would) and hands the bound arguments,
    defaults applied, to ``impl``. ``sig`` None: anything is accepted and
    only keyword arguments reach ``impl``."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if sig is None:
            return impl(SimpleNamespace(arguments=dict(kwargs)))
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        return impl(bound)

    call.__signature__ = sig  # type: ignore[attr-defined]
    return call


def installed_signature(cls: type | None, name: str) -> inspect.Signature | None:
    """The signature of ``cls.name`` as an instance calls it (``self``
    dropped), or None where the class, the method or its signature is
    unknown."""
    fn = None if cls is None else inspect.getattr_static(cls, name, None)
    if isinstance(fn, (staticmethod, classmethod)):
        fn = fn.__func__ if isinstance(fn, staticmethod) else getattr(cls, name)
        return signature_of(fn)
    sig = signature_of(fn) if callable(fn) else None
    if sig is None:
        return None
    params = list(sig.parameters.values())
    return sig.replace(parameters=params[1:]) if params else sig


def _stand_in(cls: type | None, name: str, impl: Callable[[Any], Any]) -> Any:
    return following(installed_signature(cls, name), impl)


class ProbeGroup:
    """A group description: size, rank and a ``cpu_group`` token that is
    never communicated over (the probe's recorder only compares it)."""

    def __init__(self, world_size: int, rank_in_group: int = 0) -> None:
        self.world_size = world_size
        self.rank_in_group = rank_in_group
        self.cpu_group = object()

    def barrier(self) -> None:  # a one-process stand-in has nobody to wait for
        return None

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        return tensor

    def __repr__(self) -> str:
        return f"ProbeGroup(world_size={self.world_size}, rank={self.rank_in_group})"


class _SameRanks:
    """Another object for the same group: its size and rank, and a
    ``cpu_group`` of its own where the group has one (a stand-in's token),
    so a reading over it is told apart from one over the original."""

    def __init__(self, group: Any) -> None:
        self.world_size = getattr(group, "world_size", 1)
        self.rank_in_group = getattr(group, "rank_in_group", 0)
        self.cpu_group = None if getattr(group, "cpu_group", None) is None else object()

    def barrier(self) -> None:
        return None


class _StandInRunner:
    def __init__(self, tp_group: Any) -> None:
        self.tp_group = tp_group
        self.capture_tail_hooks: list[Any] = []
        self.capture_head_hooks: list[Any] = []


class WorkerStandIn:
    """The attributes and methods ``DSparkWorkerV2.init_cuda_graphs`` reads
    across the supported releases, on no model: CUDA graphs allowed, the
    draft hosted here, no draft sampler, no deferred commit, and a draft
    worker whose ``init_cuda_graphs`` calls ``on_capture(capture)``.

    ``cls`` is the installed worker class: the stand-in's methods (and those
    of its draft worker and proposer) take what the installed ones take.
    ``capture_group`` is the group the draft graphs capture on: the worker's
    ``_draft_graph_group``, set only where the installed ``init_cuda_graphs``
    reads it (0.5.19 on), else the draft model runner's TP group.
    ``runner_group`` is the draft model runner's TP group where the worker
    has its own capture group (default: a distinct object over the same
    ranks as ``capture_group``, so which one a reading used can be told
    apart; a server's full TP group where the draft is dense under DP
    attention). Where the module
    has ``SpecTpSync``, ``_tp_sync`` is a real one built on ``dp_tp_group``
    (the worker builds it on ``get_dp_tp_group()``: the attention-TP group
    under DP attention, the TP group otherwise). A ``capture_group`` without
    a ``cpu_group`` (e.g. a ``GroupShape``) is one the repair cannot reduce
    over. ``sampler_calls`` records the arguments of every draft-sampler
    build (e.g. the ``available_memory_gb`` later releases pass); where the
    release has a folded-sampling decision, the build runs the installed one
    on a stand-in draft model (:func:`folded_model`) and ``folded`` records
    what it decided (None: no decision was made)."""

    def __init__(
        self,
        module: Any,
        cls: type | None = None,
        *,
        capture_group: Any,
        dp_tp_group: Any,
        on_capture: Any,
        device: str = "cpu",
        gpu_id: int = 0,
        runner_group: Any = None,
        dense_draft: bool = False,
        dp_attention: bool = False,
    ) -> None:
        if cls is None:
            from sglang_dspark_dp.adapter.worker import WORKER

            cls = getattr(module, WORKER, None)
        self.server_args = SimpleNamespace(
            disable_cuda_graph=False, enable_dp_attention=bool(dp_attention)
        )
        self.device = device
        self.gpu_id = gpu_id
        own_group = isinstance(cls, type) and init_reads(cls, CAPTURE_GROUP_ATTR)
        if own_group:
            if runner_group is None:
                runner_group = _SameRanks(capture_group)
            self.draft_model_runner = _StandInRunner(runner_group)
        else:
            self.draft_model_runner = _StandInRunner(capture_group)
        self.sampler_calls: list[dict[str, Any]] = []
        self.folded: bool | None = None
        draft_worker = SimpleNamespace(
            init_cuda_graphs=_stand_in(
                draft_worker_class(),
                "init_cuda_graphs",
                lambda b: on_capture(
                    bool(b.arguments.get("capture_decode_cuda_graph", True))
                ),
            )
        )
        proposer = SimpleNamespace(draft_sampler=None)
        proposer.attach_draft_sampler = _stand_in(
            proposer_class(),
            "attach_draft_sampler",
            lambda b: setattr(proposer, "draft_sampler", _first(b)),
        )
        for name, value in (
            (DECODE_GRAPH_ALLOWED, True),
            (HOSTS_DRAFT, True),
            (DRAFT_DP_CONTEXT_ENABLED, bool(dense_draft)),
            *(((CAPTURE_GROUP_ATTR, capture_group),) if own_group else ()),
            (DRAFT_SAMPLER, None),
            (DRAFT_WORKER_ATTR, draft_worker),
            (PROPOSER_ATTR, proposer),
        ):
            setattr(self, name, value)
        for name, impl in (
            (DRAFT_CONTEXT, lambda b: contextlib.nullcontext()),
            (DRAFT_SAMPLER_BUILDER, self._build_sampler),
            *((commit, lambda b: None) for commit in DEFERRED_COMMIT),
        ):
            setattr(self, name, _stand_in(cls, name, impl))
        sync_cls = getattr(module, "SpecTpSync", None)
        if isinstance(sync_cls, type):
            setattr(self, TP_SYNC_ATTR, sync_cls(dp_tp_group))

    def _build_sampler(self, bound: Any) -> None:
        self.sampler_calls.append(dict(bound.arguments))
        decide = folded_decision()
        if decide is not None:
            given = dict(bound.arguments)
            self.folded = decide_folded(
                decide,
                model=folded_model(),
                gamma=FOLDED_GAMMA,
                max_bs=FOLDED_MAX_BS,
                device=self.device,
                tp_rank=0,
                **{k: v for k, v in given.items() if k == "available_memory_gb"},
            )
        return None


def _first(bound: Any) -> Any:
    values = list(bound.arguments.values())
    return values[0] if values else None


@dataclasses.dataclass(frozen=True)
class MemoryReading:
    """One call of SGLang's memory helper during ``init_cuda_graphs``."""

    where: str  # the module whose name for the helper was called
    distributed: bool
    cpu_group: Any
    value: float | None  # GiB returned (None: the call raised)


class RecordedReadings(AttrSwap):
    """For a ``with`` block: every site's name for the memory helper records
    its calls into ``self.readings``; ``value`` set: answers that many GiB
    without calling anything (the probe), else calls through."""

    def __init__(self, sites: list[Any], *, value: float | None = None) -> None:
        self.readings: list[MemoryReading] = []
        swaps = []
        for site in sites:
            current = getattr(site, MEMORY_HELPER)
            swaps.append((site, MEMORY_HELPER, self._recorder(site, current, value)))
        super().__init__(*swaps)

    def _recorder(self, site: Any, current: Any, value: float | None) -> Any:
        sig = signature_of(current)
        where = site.__name__

        @functools.wraps(current)
        def recorder(*args: Any, **kwargs: Any) -> Any:
            arguments: dict[str, Any] = dict(kwargs)
            if sig is not None:
                try:
                    bound = sig.bind(*args, **kwargs)
                    bound.apply_defaults()
                    arguments = dict(bound.arguments)
                except TypeError:
                    pass
            distributed = bool(arguments.get("distributed", False))
            cpu_group = arguments.get("cpu_group")
            if value is not None:
                self.readings.append(
                    MemoryReading(where, distributed, cpu_group, float(value))
                )
                return value
            try:
                got = current(*args, **kwargs)
            except BaseException:
                self.readings.append(MemoryReading(where, distributed, cpu_group, None))
                raise
            self.readings.append(MemoryReading(where, distributed, cpu_group, got))
            return got

        return recorder
