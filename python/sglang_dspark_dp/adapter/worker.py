"""The DSpark worker's startup: ``DSparkWorkerV2.init_cuda_graphs``, its
capture group, SGLang's free-memory helper (by module name or through
``SpecTpSync``) and the platform checks around it."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.adapter.base import AttrSwap, dspark_class, signature_of
from sglang_dspark_dp.adapter.modules import WORKER_MODULE
from sglang_dspark_dp.outcome import DidNotEnable

WORKER = "DSparkWorkerV2"
INIT_GRAPHS = "init_cuda_graphs"
#: The startup-capture repair's hook target (``HookRegistry`` spelling).
STARTUP_TARGET = f"{WORKER_MODULE}.{WORKER}.{INIT_GRAPHS}"
#: The draft sampler's module and its folded-sampling decision, which reads
#: free memory too on some releases (by its own name for the helper, or from
#: the ``available_memory_gb`` the worker hands it).
SAMPLER_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft_sampler"
FOLDED_DECISION = "_resolve_folded_sampling"
#: Where the worker keeps its ``SpecTpSync`` (releases that have one).
TP_SYNC_ATTR = "_tp_sync"
#: The worker's step entry point (the scheduler calls it every step).
FORWARD = "forward_batch_generation"
#: The non-overlap repair's hook target (``HookRegistry`` spelling).
FORWARD_TARGET = f"{WORKER_MODULE}.{WORKER}.{FORWARD}"
#: What ``forward_batch_generation`` hands a prefill and a decode step to.
STEP_METHODS = {"prefill": "_forward_prefill", "decode": "_forward_decode"}
#: Every worker method ``forward_batch_generation`` hands a step's body to
#: (the DP prefill coordination exists on later releases only): the step
#: has reached the worker once one of them runs.
STEP_BODIES = (*STEP_METHODS.values(), "_forward_dp_spec_prefill_coordination")
#: Where the worker keeps the group its per-step decisions are taken over:
#: the draft model runner's TP group (the whole DP-attention world, or the
#: TP group under plain TP).
STEP_GROUP_SOURCE = "draft_model_runner.tp_group"
#: Its other collaborators, which a stand-in answers with no-ops.
STEP_COLLABORATORS = ("_verify_planner", "_observers")
#: Its switches a plain step (no DP attention) has off.
STEP_SWITCHES_OFF = ("enable_dp_spec_prefill_coordination",)
#: SGLang's free-memory helper: the name modules import it by, and the
#: modules that define or re-export it.
MEMORY_HELPER = "get_available_gpu_memory"
MEMORY_HELPER_HOMES = ("sglang.srt.utils.common", "sglang.srt.utils")
#: Below this many GiB of free memory the stock worker skips draft capture.
CAPTURE_CUTOFF_GIB = 1.0
#: The worker's own name for the group its draft graphs capture on (later
#: releases).
CAPTURE_GROUP_ATTR = "_draft_graph_group"
#: Where the worker keeps the group its draft graphs capture on, in the
#: order they are tried: the worker's own name for it, then the draft model
#: runner's TP group (the group ``FullCudaGraphBackend`` takes its capture
#: barriers on).
CAPTURE_GROUP_SOURCES = (CAPTURE_GROUP_ATTR, STEP_GROUP_SOURCE)
#: The worker's draft-sampler builder (``init_cuda_graphs`` calls it; later
#: releases pass it the startup memory reading).
DRAFT_SAMPLER_BUILDER = "_maybe_build_draft_sampler"
#: The rest of the worker's own state ``init_cuda_graphs`` reads: whether
#: this worker hosts the draft (False on a pipeline stage that is not the
#: last one), whether decode graphs are allowed, whether the DP draft
#: context is on, the draft sampler it built, its draft worker (whose
#: ``init_cuda_graphs`` captures the draft graphs) and its draft proposer.
HOSTS_DRAFT = "_hosts_draft"
DECODE_GRAPH_ALLOWED = "_decode_graph_allowed"
DRAFT_DP_CONTEXT_ENABLED = "_draft_dp_context_enabled"
DRAFT_SAMPLER = "_draft_sampler"
DRAFT_WORKER_ATTR = "_draft_worker"
PROPOSER_ATTR = "_proposer"
#: The worker methods ``init_cuda_graphs`` calls around the capture: the
#: draft's context manager, and the deferred commit and its wiring.
DRAFT_CONTEXT = "_draft_context"
DEFERRED_COMMIT = ("_deferred_commit", "_wire_deferred_commit")
#: The class of the worker's draft worker (:data:`DRAFT_WORKER_ATTR`).
DRAFT_WORKER_CLASS = ("sglang.srt.managers.tp_worker", "TpModelWorker")


def load_worker() -> tuple[Any, type]:
    """``(dspark_worker_v2 module, DSparkWorkerV2)``, or DidNotEnable."""
    module, cls = dspark_class(WORKER_MODULE, WORKER, "worker")
    fn = cls.__dict__.get(INIT_GRAPHS)
    if not callable(fn):
        raise DidNotEnable(f"{WORKER}.{INIT_GRAPHS} is not there (renamed target?)")
    params = list(inspect.signature(fn).parameters)
    if params != ["self"]:
        raise DidNotEnable(
            f"{WORKER}.{INIT_GRAPHS} has an unexpected signature ({', '.join(params)})"
        )
    return module, cls


def init_reads(cls: type, name: str) -> bool:
    """Whether the installed ``init_cuda_graphs`` reads attribute ``name``
    of its worker (the names its code object loads)."""
    fn = inspect.unwrap(cls.__dict__.get(INIT_GRAPHS, lambda: None))
    code = getattr(fn, "__code__", None)
    return code is not None and name in code.co_names


def reads_through_spec_tp_sync(module: Any) -> bool:
    """Whether the worker module takes its startup reading through
    ``SpecTpSync`` (it builds one: 0.5.19 on)."""
    return isinstance(getattr(module, "SpecTpSync", None), type)


def folded_decision() -> Any:
    """The installed folded-sampling decision (None: this release has none)."""
    try:
        module = importlib.import_module(SAMPLER_MODULE)
    except ImportError:
        return None
    fn = getattr(module, FOLDED_DECISION, None)
    return fn if callable(fn) else None


def folded_site() -> tuple[Any, str] | None:
    """``(module, name)`` where the draft sampler's build looks its
    folded-sampling decision up (None: this release has none)."""
    fn = folded_decision()
    if fn is None:
        return None
    return importlib.import_module(SAMPLER_MODULE), FOLDED_DECISION


def decide_folded(fn: Any, *, model: Any, gamma: int, max_bs: int, **given: Any):
    """Call the installed decision with what it takes: the model, the draft
    width and the largest batch, plus whichever of ``given`` (``device``,
    ``tp_rank``, ``available_memory_gb``) its signature names."""
    sig = signature_of(fn)
    names = set() if sig is None else set(sig.parameters)
    kwargs = {k: v for k, v in given.items() if k in names}
    return bool(fn(model=model, gamma=gamma, max_bs=max_bs, **kwargs))


def sampler_sites() -> list[Any]:
    """The draft sampler's module where it calls the memory helper by its own
    name (0.5.17-0.5.18), else nothing."""
    try:
        module = importlib.import_module(SAMPLER_MODULE)
    except ImportError:
        return []
    return [module] if hasattr(module, MEMORY_HELPER) else []


def draft_worker_class() -> type | None:
    """The installed class of the worker's draft worker (None: not found)."""
    module, name = DRAFT_WORKER_CLASS
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def proposer_class() -> type | None:
    """The installed ``DraftBlockProposer`` (None: not found)."""
    from sglang_dspark_dp.adapter.draft import DRAFT_MODULE, PROPOSER

    try:
        return getattr(importlib.import_module(DRAFT_MODULE), PROPOSER, None)
    except ImportError:
        return None


def stock_init_graphs(cls: type) -> Any:
    """``init_cuda_graphs`` as the installed SGLang wrote it, under any hook
    ``HookRegistry`` applied (its wrappers name what they wrap in
    ``__wrapped__``)."""
    return inspect.unwrap(cls.__dict__[INIT_GRAPHS])


def hosts_draft(worker: Any) -> bool:
    """Whether this worker hosts the draft (False on a pipeline stage that
    is not the last one, where ``init_cuda_graphs`` returns at once)."""
    return vars(worker).get(HOSTS_DRAFT, True) is not False


def tp_sync_of(worker: Any) -> Any:
    """The worker's own ``SpecTpSync`` (None: it has none)."""
    return vars(worker).get(TP_SYNC_ATTR)


def capture_group(worker: Any) -> tuple[Any, str] | None:
    """``(group, where it was found)`` for the group the worker's draft
    graphs capture on, or None. Read from the instance's own attributes
    (``DSparkWorkerV2.__getattr__`` forwards unknown names to the target
    worker, whose groups are not the draft's). A group needs ``world_size``
    and, with more than one rank, a ``cpu_group`` (as SGLang's
    ``GroupCoordinator`` has): a ``cpu_group`` of None would make the
    reduction run over the default group instead."""
    for where in CAPTURE_GROUP_SOURCES:
        group = _group_at(worker, where)
        if group is not None:
            return group, where
    return None


def step_group(worker: Any) -> Any:
    """The group the worker's per-step decisions are taken over
    (:data:`STEP_GROUP_SOURCE`, read as :func:`capture_group` reads), or
    None."""
    return _group_at(worker, STEP_GROUP_SOURCE)


def _group_at(worker: Any, where: str) -> Any:
    state = vars(worker)
    owner_name, _, attr = where.rpartition(".")
    if owner_name:
        owner = state.get(owner_name)
        group = None if owner is None else getattr(owner, attr, None)
    else:
        group = state.get(where)
    size = getattr(group, "world_size", None)
    if not isinstance(size, int):
        return None
    if size <= 1 or getattr(group, "cpu_group", None) is not None:
        return group
    return None


def _distributed_call(fn: Any, cpu_group: Any) -> Any:
    """``fn`` (SGLang's memory helper, or whatever stands where it is looked
    up) called with ``distributed=True, cpu_group=cpu_group``; every other
    argument passes through."""
    sig = signature_of(fn)
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
    helper, and the draft sampler module's where it has one, call it
    reduced over ``group`` (releases whose ``init_cuda_graphs`` and
    folded-sampling decision call the helper by those names)."""
    current = getattr(module, MEMORY_HELPER, None)
    if current is None:
        raise LookupError(f"{module.__name__} has no name {MEMORY_HELPER}")
    swaps = [(module, MEMORY_HELPER, _distributed_call(current, group.cpu_group))]
    for site in sampler_sites():
        helper = getattr(site, MEMORY_HELPER)
        swaps.append((site, MEMORY_HELPER, _distributed_call(helper, group.cpu_group)))
    return AttrSwap(*swaps)


def pretend_cuda(module: Any) -> AttrSwap:
    """For a ``with`` block on CPU: the worker module's platform checks
    answer CUDA (the stock decision reads memory only on CUDA-like
    platforms) and its pipeline-stage scope is a no-op (it needs SGLang's
    process groups, which a CPU stand-in does not have)."""
    swaps: list[tuple[Any, str, Any]] = []
    for name in ("is_cuda", "is_cuda_alike"):
        if callable(getattr(module, name, None)):
            swaps.append((module, name, lambda: True))
    if callable(getattr(module, "draft_pp_context", None)):
        swaps.append((module, "draft_pp_context", contextlib.nullcontext))
    if sampler_sites():  # its decision asks CUDA for the current device
        import torch

        swaps.append((torch.cuda, "current_device", lambda: 0))
    return AttrSwap(*swaps)


def memory_helper_sites(module: Any, worker: Any = None) -> list[Any]:
    """Every module whose global name for the memory helper the worker's
    startup reading can go through: the worker module, the module of its
    ``_tp_sync`` (if any) and the helper's homes (deduplicated)."""
    sites = [module]
    tp_sync = None if worker is None else tp_sync_of(worker)
    if tp_sync is not None:
        sync_module = sys.modules.get(type(tp_sync).__module__)
        if sync_module is not None:
            sites.append(sync_module)
    sites.extend(sampler_sites())
    for home in MEMORY_HELPER_HOMES:
        sites.append(importlib.import_module(home))
    out: list[Any] = []
    for site in sites:
        if hasattr(site, MEMORY_HELPER) and all(site is not s for s in out):
            out.append(site)
    return out


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


#: The argument the worker's draft worker takes its capture decision by.
DRAFT_CAPTURE_ARG = "capture_decode_cuda_graph"
#: The draft worker's method that captures the draft graphs (it enters the
#: capture barriers on the capture group).
DRAFT_INIT_GRAPHS = "init_cuda_graphs"


def draft_worker_of(worker: Any) -> Any:
    """The worker's draft worker (None: it has none), from the instance's
    own attributes."""
    return vars(worker).get(DRAFT_WORKER_ATTR)


def capture_decision(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The capture decision a call of the draft worker's
    ``init_cuda_graphs`` carries (positional or by name; absent: the
    method's default, capture)."""
    if DRAFT_CAPTURE_ARG in kwargs:
        return bool(kwargs[DRAFT_CAPTURE_ARG])
    return bool(args[0]) if args else True


def dp_attention_on(worker: Any) -> bool:
    """Whether the worker's server runs DP attention (its server args)."""
    args = vars(worker).get("server_args")
    return bool(getattr(args, "enable_dp_attention", False))
