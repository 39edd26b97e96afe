"""The one module that touches SGLang's private names.

Everything this package reads or writes inside the installed SGLang that is
not a documented API goes through here: the DSpark draft module and its
proposer's private attributes, ``HookRegistry``'s bookkeeping, the parallel
context's override fields, the scheduler's DP sync writer and the private
state of a ``DecodeCudaGraphRunner``. When a release renames something, this
is the file to read. Imports of SGLang are deferred to call time, so
importing this module never imports SGLang.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from contextlib import AbstractContextManager
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.outcome import DidNotEnable

DRAFT_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"
PROPOSER = "DraftBlockProposer"
FILL = "_fill_dp_moe_sync_metadata"
#: The draft-batch repair's hook target (``HookRegistry`` spelling).
TARGET = f"{DRAFT_MODULE}.{PROPOSER}.{FILL}"

#: The SGLang function that writes the all-gathered sync sizes into a
#: ``ScheduleBatch`` (what the scheduler runs after its DP all-gather).
SYNC_WRITER = "sglang.srt.managers.scheduler_components.dp_attn._update_gather_batch"
_SYNC_WRITER_NAME = SYNC_WRITER.rpartition(".")[2]


# --------------------------------------------------------------------------
# The installed DSpark draft API.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SGLangAPI:
    """The handful of installed SGLang objects the repairs work with."""

    proposer_cls: type
    forward_batch_cls: type
    schedule_batch_cls: type
    forward_mode: Any
    capture_hidden_mode: Any
    spec_algorithm: Any
    get_parallel: Any
    make_spec_info: Any
    draft_module: Any
    fbi_module: Any
    spec_module: Any

    # SGLang functions the fill calls are looked up at call time, where the
    # stock fill looks them up (the draft module's namespace where it
    # imports them, else their home module), so a ``mock.patch`` in SGLang's
    # own unit-test style, or another plugin's hook, reaches the repair too.

    def enable_num_token_non_padded(self) -> bool:
        fn = getattr(self.draft_module, "enable_num_token_non_padded", None)
        if fn is None:
            fn = self.fbi_module.enable_num_token_non_padded
        return bool(fn())

    def scale(self, spec_info: Any, counts: Any, logprob_counts: Any) -> Any:
        fn = getattr(self.draft_module, "spec_scale_global_num_tokens", None)
        if fn is None:
            fn = self.spec_module.spec_scale_global_num_tokens
        return fn(spec_info, counts, logprob_counts)


def _dspark_class(module_name: str, cls_name: str, what: str) -> tuple[Any, type]:
    """``(module, class)`` of a DSpark component, or DidNotEnable saying
    which is missing."""
    try:
        importlib.import_module("sglang")
    except ImportError as exc:
        raise DidNotEnable(f"sglang is not importable ({exc})") from exc
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DidNotEnable(
            f"the installed SGLang has no DSpark {what} module {module_name} ({exc})"
        ) from exc
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise DidNotEnable(f"{module_name} has no class {cls_name}")
    return module, cls


def load_sglang_api() -> SGLangAPI:
    """Import what the draft-batch repair needs, or raise DidNotEnable."""
    draft, proposer_cls = _dspark_class(DRAFT_MODULE, PROPOSER, "draft")
    for attr in (FILL, "_run_forward", "run_idle_participation"):
        if not callable(getattr(proposer_cls, attr, None)):
            raise DidNotEnable(f"{PROPOSER}.{attr} is not there (renamed target?)")
    params = list(inspect.signature(getattr(proposer_cls, FILL)).parameters)
    if params != ["self", "forward_batch", "batch"]:
        raise DidNotEnable(
            f"{PROPOSER}.{FILL} has an unexpected signature ({', '.join(params)})"
        )
    try:
        fbi = importlib.import_module("sglang.srt.model_executor.forward_batch_info")
        sb = importlib.import_module("sglang.srt.managers.schedule_batch")
        spec = importlib.import_module("sglang.srt.speculative.spec_info")
        rc = importlib.import_module("sglang.srt.runtime_context")
        dwc = importlib.import_module("sglang.srt.speculative.draft_worker_common")
        # Resolved at call time (see SGLangAPI); here only checked present.
        fbi.enable_num_token_non_padded  # noqa: B018
        spec.spec_scale_global_num_tokens  # noqa: B018
        return SGLangAPI(
            proposer_cls=proposer_cls,
            forward_batch_cls=fbi.ForwardBatch,
            schedule_batch_cls=sb.ScheduleBatch,
            forward_mode=fbi.ForwardMode,
            capture_hidden_mode=fbi.CaptureHiddenMode,
            spec_algorithm=spec.SpeculativeAlgorithm,
            get_parallel=rc.get_parallel,
            make_spec_info=dwc.make_draft_block_spec_info,
            draft_module=draft,
            fbi_module=fbi,
            spec_module=spec,
        )
    except (ImportError, AttributeError) as exc:
        raise DidNotEnable(
            f"an SGLang API the repair needs is missing ({exc})"
        ) from exc


def stock_fill(api: SGLangAPI) -> Any:
    """The installed fill as SGLang wrote it (under any applied hook)."""
    fill = getattr(api.proposer_cls, FILL)
    return getattr(fill, "__wrapped__", fill)


# The proposer's private state the hook and the drivers read.


def dp_moe_sync(proposer: Any) -> bool:
    """Whether this proposer runs the DP/EP sync path (DP attention on)."""
    return bool(proposer._dp_moe_sync)


def draft_spec_info(proposer: Any) -> Any:
    """The proposer's draft-block spec info (the draft batch's spec_info)."""
    return proposer._draft_block_spec_info


def draft_width(proposer: Any) -> int:
    """Draft tokens per request of this proposer's draft block."""
    return int(draft_spec_info(proposer).num_tokens_per_req)


def run_busy_forward(proposer: Any, **kwargs: Any) -> Any:
    """The draft forward of a rank with requests (the proposer's own)."""
    return proposer._run_forward(**kwargs)


def run_idle_forward(proposer: Any, batch: Any) -> Any:
    """The draft forward of a rank without requests."""
    return proposer.run_idle_participation(batch)


# --------------------------------------------------------------------------
# HookRegistry.
# --------------------------------------------------------------------------


def hook_registry() -> tuple[Any, Any]:
    """SGLang's ``(HookRegistry, HookType)``, or DidNotEnable."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as exc:
        raise DidNotEnable(f"the installed SGLang has no plugin API ({exc})") from exc
    return HookRegistry, HookType


def is_patched(target: str) -> bool:
    """Whether ``HookRegistry`` has already applied hooks to ``target``."""
    registry, _ = hook_registry()
    return target in registry._patched


def hooks_on(target: str) -> list[Any]:
    """The hook callables registered on ``target``, in order."""
    registry, _ = hook_registry()
    return [entry[1] for entry in registry._hooks.get(target, [])]


def register_around(target: str, hook: Any) -> None:
    registry, kind = hook_registry()
    registry.register(target, hook, kind.AROUND)


def apply_hooks() -> None:
    registry, _ = hook_registry()
    registry.apply_hooks()


def remove_hook(target: str, hook: Any, owner: type, attr: str, original: Any) -> None:
    """Drop ``hook`` from ``target``, put ``original`` back on ``owner`` and
    re-apply any other plugin's hooks on the same target."""
    registry, _ = hook_registry()
    others = [h for h in registry._hooks.get(target, []) if h[1] is not hook]
    if target in registry._patched:
        setattr(owner, attr, original)
        registry._patched.discard(target)
    if others:
        registry._hooks[target] = others
        registry.apply_hooks()
    else:
        registry._hooks.pop(target, None)


# --------------------------------------------------------------------------
# Topology through get_parallel().override(...).
# --------------------------------------------------------------------------


class GroupShape:
    """Size and rank of a process group that is not created here."""

    __slots__ = ("world_size", "rank_in_group")

    def __init__(self, world_size: int, rank_in_group: int) -> None:
        self.world_size = world_size
        self.rank_in_group = rank_in_group

    def __repr__(self) -> str:
        return f"GroupShape(world_size={self.world_size}, rank={self.rank_in_group})"


def accepted_parallel_fields() -> frozenset[str] | None:
    """The installed ParallelContext's override keys (None: unknown)."""
    rc = importlib.import_module("sglang.srt.runtime_context")
    fields = getattr(rc, "_parallel_fields", None)
    if callable(fields):
        return frozenset(fields())
    fields = getattr(rc, "_PARALLEL_FIELDS", None)
    return None if fields is None else frozenset(fields)


def topology_values(
    *,
    dp_size: int,
    dp_rank: int = 0,
    ep_size: int = 1,
    attn_tp_size: int = 1,
    attn_tp_rank: int = 0,
) -> dict[str, Any]:
    """Parallel values of one rank of ``--tp dp*attn_tp --dp dp --ep ep``
    (DP attention on when ``dp_size > 1``)."""
    dp_attention = dp_size > 1
    tp_size = dp_size * attn_tp_size
    tp_rank = dp_rank * attn_tp_size + attn_tp_rank
    return {
        "tp_size": tp_size,
        "tp_rank": tp_rank,
        "attn_tp_size": attn_tp_size,
        "attn_tp_rank": attn_tp_rank,
        "attn_dp_size": dp_size,
        "attn_dp_rank": dp_rank,
        "attn_dp_enabled": dp_attention,
        "moe_ep_size": ep_size,
        "moe_ep_rank": tp_rank % ep_size,
        "moe_tp_size": max(tp_size // ep_size, 1),
        "moe_tp_rank": tp_rank // ep_size,
        "moe_dp_size": 1,
        "moe_dp_rank": 0,
        "attn_cp_size": 1,
        "attn_cp_rank": 0,
        "enable_prefill_cp": False,
        # No process groups exist here: a description of the attention-TP
        # group stands in (its size and this rank); nothing communicates.
        "attn_tp_group": GroupShape(attn_tp_size, attn_tp_rank),
    }


def parallel_override(
    get_parallel: Any, **topology: int
) -> AbstractContextManager[Any]:
    """``get_parallel().override(...)`` for the topology, with only the keys
    the installed SGLang knows."""
    values = topology_values(**topology)
    accepted = accepted_parallel_fields()
    if accepted is not None:
        values = {k: v for k, v in values.items() if k in accepted}
    return get_parallel().override(**values)


def dp_rank_and_size(api: SGLangAPI, default_size: int) -> tuple[int | None, int]:
    """This process's DP-attention rank and size (rank None: no parallel
    state, as in tools and unit tests)."""
    try:
        par = api.get_parallel()
        return int(par.attn_dp_rank), int(par.attn_dp_size)
    except Exception:
        return None, default_size


# --------------------------------------------------------------------------
# The scheduler's DP sync writer.
# --------------------------------------------------------------------------


class SyncPathFailed(RuntimeError):
    """SGLang's own sync-size writer could not be driven: nothing writes the
    fields by hand and reports a healthy SGLang."""


def load_sync_writer() -> Any:
    """SGLang's ``_update_gather_batch``, or DidNotEnable saying why."""
    module, _, name = SYNC_WRITER.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise DidNotEnable(
            f"cannot drive SGLang's DP sync path: {SYNC_WRITER} is not there ({exc})"
        ) from exc


def write_sync_sizes(writer: Any, batch: Any, gathered: list[list[int]], rank: int):
    """Write the all-gathered ``[tokens, logprob tokens, can_graph]`` rows
    into ``batch`` with SGLang's own writer, as the scheduler does."""
    counts = [g[0] for g in gathered]
    logprob = [g[1] for g in gathered]
    can_graph = bool(min(g[2] for g in gathered))
    info = SimpleNamespace(
        num_tokens=counts[rank],
        num_tokens_for_logprob=logprob[rank],
        global_num_tokens=counts,
        global_num_tokens_for_logprob=logprob,
        can_cuda_graph=can_graph,
        can_run_decode_cuda_graph=can_graph,
        can_run_draft_cuda_graph=can_graph,
        can_run_breakable_cuda_graph=False,
        can_run_prefill_cuda_graph=False,
        prefill_cuda_graph_max_prefix_len=0,
        is_extend_in_batch=False,
        tbo_split_seq_index=None,
        global_forward_mode=None,
        tp0_info_cpu=None,
        any_health_check=False,
        global_attention_pairs=None,
        dp_cooperation_info=None,
    )
    try:
        writer(batch, info, True)
    except Exception as exc:
        raise SyncPathFailed(
            f"SGLang's {_SYNC_WRITER_NAME} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if batch.global_num_tokens != counts:
        raise SyncPathFailed(
            f"SGLang's {_SYNC_WRITER_NAME} wrote global_num_tokens="
            f"{batch.global_num_tokens!r}, expected {counts!r}"
        )
    if hasattr(batch, "can_run_decode_cuda_graph"):
        batch.can_run_decode_cuda_graph = can_graph


# --------------------------------------------------------------------------
# CUDA-graph admission: capture sizes and a DecodeCudaGraphRunner's state.
# --------------------------------------------------------------------------


def capture_sizes(max_bs: int) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures with speculative
    decoding on and ``--cuda-graph-max-bs-decode max_bs``, from SGLang's own
    generator (its location moved between releases)."""
    args = SimpleNamespace(
        disable_cuda_graph_padding=False, speculative_algorithm="DSPARK"
    )
    try:
        from sglang.srt.arg_groups.cuda_graph_hook import (
            generate_decode_cuda_graph_batch_sizes as gen,
        )
    except ImportError:
        from sglang.srt.server_args import ServerArgs

        return sorted(ServerArgs._generate_decode_cuda_graph_batch_sizes(args, max_bs))
    try:
        return sorted(gen(args, max_bs))
    except Exception:
        from sglang.srt.server_args import ServerArgs

        full = ServerArgs.__new__(ServerArgs)
        full.__dict__.update(vars(args))
        return sorted(gen(full, max_bs))


def graph_runner(
    api: SGLangAPI, *, dp_size: int, width: int, capture_bs: list[int]
) -> Any:
    """A real ``DecodeCudaGraphRunner`` object whose ``can_run_graph`` decides
    admission as the draft's runner would under DP attention (``dp_size > 1``:
    ``require_mlp_tp_gather`` and ``require_mlp_sync`` on, as ``__init__``
    derives them for a MoE draft without ``--moe-dense-tp-size``) or attention
    TP (``dp_size == 1``: both off). Made without ``__init__``, which captures
    graphs from a loaded model; only what ``can_run_graph`` reads is set."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    runner = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    dp_attention = dp_size > 1
    runner.__dict__.update(
        ragged_verify_mode=False,
        captured_req_width=width,
        require_mlp_tp_gather=dp_attention,
        require_attn_tp_gather=False,
        require_gathered_buffer=dp_attention,
        require_mlp_sync=dp_attention,
        enable_pdmux=False,
        disable_padding=False,
        capture_bs=list(capture_bs),
        max_bs=max(capture_bs),
        is_encoder_decoder=False,
        capture_hidden_mode=api.capture_hidden_mode.NULL,
        enable_two_batch_overlap=False,
        record_nolora_graph=False,
        model_runner=SimpleNamespace(spec_algorithm=api.spec_algorithm.DSPARK),
    )
    return runner


# --------------------------------------------------------------------------
# The draft worker's startup capture decision (dspark_worker_v2).
# --------------------------------------------------------------------------

WORKER_MODULE = "sglang.srt.speculative.dspark_components.dspark_worker_v2"
WORKER = "DSparkWorkerV2"
INIT_GRAPHS = "init_cuda_graphs"
#: The startup-capture repair's hook target (``HookRegistry`` spelling).
STARTUP_TARGET = f"{WORKER_MODULE}.{WORKER}.{INIT_GRAPHS}"
#: SGLang's free-memory helper: the name modules import it by, and the
#: modules that define or re-export it.
MEMORY_HELPER = "get_available_gpu_memory"
MEMORY_HELPER_HOMES = ("sglang.srt.utils.common", "sglang.srt.utils")
#: Below this many GiB of free memory the stock worker skips draft capture.
CAPTURE_CUTOFF_GIB = 1.0
#: The ``SpecTpSyncSite`` member of the startup memory reading (by name).
MEMORY_SITE = "DSPARK_MEM"
#: Where the worker keeps the group its draft graphs capture on, in the
#: order they are tried: the worker's own name for it (later releases),
#: then the draft model runner's TP group (the group ``FullCudaGraphBackend``
#: takes its capture barriers on).
CAPTURE_GROUP_SOURCES = ("_draft_graph_group", "draft_model_runner.tp_group")

_MISSING = object()


class AttrSwap:
    """Set ``(obj, name, value)`` attributes for a ``with`` block and put
    back exactly what was there (an attribute that was absent from the
    object's own ``__dict__`` is deleted again, so an instance override
    never leaves a stale bound method behind)."""

    def __init__(self, *swaps: tuple[Any, str, Any]) -> None:
        self._swaps = swaps
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> AttrSwap:
        for obj, name, value in self._swaps:
            self._saved.append((obj, name, vars(obj).get(name, _MISSING)))
            setattr(obj, name, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._saved:
            obj, name, old = self._saved.pop()
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)


def load_worker() -> tuple[Any, type]:
    """``(dspark_worker_v2 module, DSparkWorkerV2)``, or DidNotEnable."""
    module, cls = _dspark_class(WORKER_MODULE, WORKER, "worker")
    fn = cls.__dict__.get(INIT_GRAPHS)
    if not callable(fn):
        raise DidNotEnable(f"{WORKER}.{INIT_GRAPHS} is not there (renamed target?)")
    params = list(inspect.signature(fn).parameters)
    if params != ["self"]:
        raise DidNotEnable(
            f"{WORKER}.{INIT_GRAPHS} has an unexpected signature ({', '.join(params)})"
        )
    return module, cls


def stock_init_graphs(cls: type) -> Any:
    """``init_cuda_graphs`` as the installed SGLang wrote it, under any hook
    ``HookRegistry`` applied (its wrappers name what they wrap in
    ``__wrapped__``)."""
    return inspect.unwrap(cls.__dict__[INIT_GRAPHS])


def hosts_draft(worker: Any) -> bool:
    """Whether this worker hosts the draft (False on a pipeline stage that
    is not the last one, where ``init_cuda_graphs`` returns at once)."""
    return vars(worker).get("_hosts_draft", True) is not False


def capture_group(worker: Any) -> tuple[Any, str] | None:
    """``(group, where it was found)`` for the group the worker's draft
    graphs capture on, or None. Read from the instance's own attributes
    (``DSparkWorkerV2.__getattr__`` forwards unknown names to the target
    worker, whose groups are not the draft's). A group needs ``world_size``
    and, with more than one rank, a ``cpu_group`` (as SGLang's
    ``GroupCoordinator`` has): a ``cpu_group`` of None would make the
    reduction run over the default group instead."""
    state = vars(worker)
    for where in CAPTURE_GROUP_SOURCES:
        owner_name, _, attr = where.rpartition(".")
        if owner_name:
            owner = state.get(owner_name)
            group = None if owner is None else getattr(owner, attr, None)
        else:
            group = state.get(where)
        size = getattr(group, "world_size", None)
        if not isinstance(size, int):
            continue
        if size <= 1 or getattr(group, "cpu_group", None) is not None:
            return group, where
    return None


def _signature(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def _distributed_call(fn: Any, cpu_group: Any) -> Any:
    """``fn`` (SGLang's memory helper, or whatever stands where it is looked
    up) called with ``distributed=True, cpu_group=cpu_group``; every other
    argument passes through."""
    import functools

    sig = _signature(fn)
    if sig is not None and not {"distributed", "cpu_group"} <= set(sig.parameters):
        sig = None

    @functools.wraps(fn)
    def reading(*args: Any, **kwargs: Any) -> Any:
        if sig is None:
            kwargs.update(distributed=True, cpu_group=cpu_group)
            return fn(*args, **kwargs)
        bound = sig.bind(*args, **kwargs)
        bound.arguments["distributed"] = True
        bound.arguments["cpu_group"] = cpu_group
        return fn(*bound.args, **bound.kwargs)

    return reading


def reduced_module_reading(module: Any, group: Any) -> AttrSwap:
    """For a ``with`` block: the worker module's own name for the memory
    helper calls it reduced over ``group`` (releases whose
    ``init_cuda_graphs`` calls the helper by that name)."""
    current = getattr(module, MEMORY_HELPER, None)
    if current is None:
        raise LookupError(f"{module.__name__} has no name {MEMORY_HELPER}")
    return AttrSwap(
        (module, MEMORY_HELPER, _distributed_call(current, group.cpu_group))
    )


def memory_helper_near(obj: Any) -> Any:
    """The memory helper as ``obj``'s class's module looks it up (so a
    mock or another hook there is reached), else SGLang's own."""
    import sys

    found = getattr(sys.modules.get(type(obj).__module__), MEMORY_HELPER, None)
    if found is None:
        found = getattr(importlib.import_module(MEMORY_HELPER_HOMES[1]), MEMORY_HELPER)
    return found


def reduced_tp_sync_reading(worker: Any, group: Any) -> AttrSwap:
    """For a ``with`` block: ``worker._tp_sync.available_memory_gb`` (this
    instance only) reduces the ``DSPARK_MEM`` reading over ``group``;
    every other site goes to the stock method unchanged, and no other sync
    site of ``SpecTpSync`` is touched."""
    import functools

    tp_sync = vars(worker).get("_tp_sync")
    if tp_sync is None or not callable(getattr(tp_sync, "available_memory_gb", None)):
        raise LookupError("the worker has no _tp_sync.available_memory_gb")
    stock = tp_sync.available_memory_gb
    sig = _signature(stock)
    if sig is None or not {"site", "device", "gpu_id"} <= set(sig.parameters):
        raise LookupError("_tp_sync.available_memory_gb has an unexpected signature")
    cpu_group = group.cpu_group

    @functools.wraps(stock)
    def available_memory_gb(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        site = bound.arguments["site"]
        if getattr(site, "name", None) != MEMORY_SITE:
            return stock(*args, **kwargs)
        helper = memory_helper_near(tp_sync)
        return helper(
            bound.arguments["device"],
            bound.arguments["gpu_id"],
            distributed=True,
            cpu_group=cpu_group,
        )

    return AttrSwap((tp_sync, "available_memory_gb", available_memory_gb))


# A stand-in worker: what ``init_cuda_graphs`` reads, with no model behind it.


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


class _StandInRunner:
    def __init__(self, tp_group: Any) -> None:
        self.tp_group = tp_group
        self.capture_tail_hooks: list[Any] = []
        self.capture_head_hooks: list[Any] = []


class _StandInDraftWorker:
    def __init__(self, on_capture: Any) -> None:
        self._on_capture = on_capture

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        self._on_capture(bool(capture_decode_cuda_graph))


class _StandInProposer:
    def attach_draft_sampler(self, sampler: Any) -> None:
        self.draft_sampler = sampler


class WorkerStandIn:
    """The attributes and methods ``DSparkWorkerV2.init_cuda_graphs`` reads
    across the supported releases, on no model: CUDA graphs allowed, the
    draft hosted here, no draft sampler, no deferred commit, and a draft
    worker whose ``init_cuda_graphs`` calls ``on_capture(capture)``.

    ``capture_group`` is the group the draft graphs capture on (the draft
    model runner's TP group and ``_draft_graph_group``); where the module
    has ``SpecTpSync``, ``_tp_sync`` is a real one built on ``dp_tp_group``
    (the worker builds it on ``get_dp_tp_group()``: the attention-TP group
    under DP attention, the TP group otherwise). A ``capture_group`` without
    a ``cpu_group`` (e.g. a :class:`GroupShape`) is one the repair cannot
    reduce over."""

    def __init__(
        self,
        module: Any,
        *,
        capture_group: Any,
        dp_tp_group: Any,
        on_capture: Any,
        device: str = "cpu",
        gpu_id: int = 0,
    ) -> None:
        self.server_args = SimpleNamespace(disable_cuda_graph=False)
        self._decode_graph_allowed = True
        self._hosts_draft = True
        self._draft_dp_context_enabled = False
        self.device = device
        self.gpu_id = gpu_id
        self.draft_model_runner = _StandInRunner(capture_group)
        self._draft_graph_group = capture_group
        self._draft_worker = _StandInDraftWorker(on_capture)
        self._proposer = _StandInProposer()
        self._draft_sampler = None
        sync_cls = getattr(module, "SpecTpSync", None)
        if isinstance(sync_cls, type):
            self._tp_sync = sync_cls(dp_tp_group)

    def _draft_context(self) -> Any:
        import contextlib

        return contextlib.nullcontext()

    def _maybe_build_draft_sampler(self) -> None:
        return None

    def _deferred_commit(self) -> None:
        return None

    def _wire_deferred_commit(self, commit: Any) -> None:
        return None


def pretend_cuda(module: Any) -> AttrSwap:
    """For a ``with`` block on CPU: the worker module's platform checks
    answer CUDA (the stock decision reads memory only on CUDA-like
    platforms) and its pipeline-stage scope is a no-op (it needs SGLang's
    process groups, which a CPU stand-in does not have)."""
    import contextlib

    swaps: list[tuple[Any, str, Any]] = []
    for name in ("is_cuda", "is_cuda_alike"):
        if callable(getattr(module, name, None)):
            swaps.append((module, name, lambda: True))
    if callable(getattr(module, "draft_pp_context", None)):
        swaps.append((module, "draft_pp_context", contextlib.nullcontext))
    return AttrSwap(*swaps)


@dataclasses.dataclass(frozen=True)
class MemoryReading:
    """One call of SGLang's memory helper during ``init_cuda_graphs``."""

    where: str  # the module whose name for the helper was called
    distributed: bool
    cpu_group: Any
    value: float | None  # GiB returned (None: the call raised)


def memory_helper_sites(module: Any, worker: Any = None) -> list[Any]:
    """Every module whose global name for the memory helper the worker's
    startup reading can go through: the worker module, the module of its
    ``_tp_sync`` (if any) and the helper's homes (deduplicated)."""
    sites = [module]
    tp_sync = None if worker is None else vars(worker).get("_tp_sync")
    if tp_sync is not None:
        import sys

        sync_module = sys.modules.get(type(tp_sync).__module__)
        if sync_module is not None:
            sites.append(sync_module)
    for home in MEMORY_HELPER_HOMES:
        sites.append(importlib.import_module(home))
    out: list[Any] = []
    for site in sites:
        if hasattr(site, MEMORY_HELPER) and all(site is not s for s in out):
            out.append(site)
    return out


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
        import functools

        sig = _signature(current)
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


def injected_free_memory(gib: float) -> AttrSwap:
    """For a ``with`` block: SGLang's memory helper, asked about ``"cpu"``,
    finds ``gib`` GiB free (it reads ``psutil.virtual_memory().available``
    split over the NUMA nodes, capped by the cgroup on later releases): one
    NUMA node, no cgroup cap, that much available."""
    import psutil

    common = importlib.import_module(MEMORY_HELPER_HOMES[0])
    available = int(gib * (1 << 30))

    def virtual_memory() -> Any:
        return SimpleNamespace(available=available, total=max(available, 1 << 40))

    swaps: list[tuple[Any, str, Any]] = [(psutil, "virtual_memory", virtual_memory)]
    if callable(getattr(common, "get_cpu_ids_by_node", None)):
        swaps.append((common, "get_cpu_ids_by_node", lambda: ["0"]))
    if callable(getattr(common, "get_instance_memory_status", None)):
        swaps.append((common, "get_instance_memory_status", lambda *_a, **_k: None))
    return AttrSwap(*swaps)
