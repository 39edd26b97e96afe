"""DSpark's verify planner: ``DSparkVerifyPlanner``'s per-step verify token
budget, the group its ``verify_lens`` broadcast runs on, and the planner
module's names a CPU probe or harness stands in for.

Every SGLang-private name of the verify-budget repair is spelled here:

* the budget method ``_budget_from_resolved`` (both the overlap path,
  ``prepare_verify_budget``, and the non-overlap path,
  ``compute_budget_sync``, go through it; same keyword-only signature on
  every release that ships DSpark);
* the broadcast group, found by what the installed code has: a module
  function ``verify_lens_broadcast_group(tp_size=...)`` returning
  ``(group, size)`` (0.5.16-0.5.18), else the planner's ``SpecTpSync``,
  whose group is its ``_tp_group`` (0.5.19 on: the attention-TP group under
  DP attention, the TP group otherwise);
* ``ConfidenceRelay``'s host ring (the overlap path's lagged copy of the
  draft confidences), which a CPU harness fills by hand;
* the planner module's global names for the runtime context, the process
  groups, the ragged-verify mode and the SPS table loader, which the probe
  and the harness replace for the duration of a ``with`` block.

SGLang is imported at call time.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from sglang_dspark_dp.adapter.base import AttrSwap, dspark_class
from sglang_dspark_dp.adapter.modules import PLANNER_MODULE
from sglang_dspark_dp.outcome import DidNotEnable

PLANNER = "DSparkVerifyPlanner"
BUDGET = "_budget_from_resolved"
#: The verify-budget repair's hook target (``HookRegistry`` spelling).
BUDGET_TARGET = f"{PLANNER_MODULE}.{PLANNER}.{BUDGET}"
#: The keyword arguments ``_budget_from_resolved`` takes (after ``self``).
BUDGET_PARAMS = ("resolved", "req_pool_indices_cpu")
#: 0.5.16-0.5.18: a module function returns ``(group, size)``.
GROUP_FUNCTION = "verify_lens_broadcast_group"
#: 0.5.19 on: the planner's ``SpecTpSync`` (constructor argument ``tp_sync``).
TP_SYNC_CLASS = "SpecTpSync"
TP_SYNC_ATTR = "_tp_sync"
TP_SYNC_GROUP = "_tp_group"
#: How the installed planner finds its broadcast group.
SHAPE_FUNCTION = "group-function"
SHAPE_TP_SYNC = "tp-sync"
SHAPE_WHERE = {
    SHAPE_FUNCTION: f"{GROUP_FUNCTION}(tp_size=...)",
    SHAPE_TP_SYNC: f"the planner's {TP_SYNC_CLASS} group",
}
#: The overlap path's confidence relay.
RELAY_MODULE = "sglang.srt.managers.overlap_utils"
RELAY = "ConfidenceRelay"
RELAY_LAG = "CONFIDENCE_RELAY_RING_LAG"
RELAY_DEPTH = "CONFIDENCE_RELAY_RING_DEPTH"
RESOLVE = "resolve"
#: The relay-wait repair's hook target (``HookRegistry`` spelling).
RESOLVE_TARGET = f"{RELAY_MODULE}.{RELAY}.{RESOLVE}"
#: ``ConfidenceRelay.resolve``'s parameters after ``self``.
RESOLVE_PARAMS = ("batch", "stream", "publish_ready")
SPS_MODULE = "sglang.srt.speculative.dspark_components.dspark_sps"
RAGGED_MODULE = "sglang.srt.speculative.ragged_verify"
#: ``SGLANG_RAGGED_VERIFY_MODE`` values that schedule a verify budget.
COMPACT = "compact"
CAP_ACCEPT = "cap-accept"
#: The planner module's global names a CPU run stands in for, each with
#: what it answers (see :func:`runtime_swaps`).
RUNTIME_NAMES = (
    "get_parallel",
    "get_schedule",
    "get_spec",
    "get_disagg",
    "get_tp_group",
    "is_dp_attention_enabled",
    "read_ragged_verify_mode",
    "load_sps_table_from_path",
)


def load_planner() -> tuple[Any, type]:
    """``(dspark_planner module, DSparkVerifyPlanner)``, or DidNotEnable."""
    module, cls = dspark_class(PLANNER_MODULE, PLANNER, "verify planner")
    fn = cls.__dict__.get(BUDGET)
    if not callable(fn):
        raise DidNotEnable(f"{PLANNER}.{BUDGET} is not there (renamed target?)")
    params = inspect.signature(inspect.unwrap(fn)).parameters
    names = [p for p in params if p != "self"]
    if sorted(names) != sorted(BUDGET_PARAMS) or any(
        params[p].kind is not inspect.Parameter.KEYWORD_ONLY for p in names
    ):
        raise DidNotEnable(
            f"{PLANNER}.{BUDGET} has an unexpected signature ({', '.join(params)})"
        )
    for name in ("schedules_verify_budget", "is_verify_all", "schedule_layout"):
        if not hasattr(cls, name):
            raise DidNotEnable(f"{PLANNER} has no {name} (renamed?)")
    return module, cls


def stock_budget(cls: type) -> Any:
    """``_budget_from_resolved`` as the installed SGLang wrote it, under any
    hook ``HookRegistry`` applied."""
    return inspect.unwrap(cls.__dict__[BUDGET])


def group_shape(module: Any) -> str | None:
    """How the installed planner finds the group its ``verify_lens``
    broadcast runs on (None: neither way is there)."""
    if callable(getattr(module, GROUP_FUNCTION, None)):
        return SHAPE_FUNCTION
    if isinstance(getattr(module, TP_SYNC_CLASS, None), type):
        return SHAPE_TP_SYNC
    return None


def _tp_size(planner: Any, module: Any) -> int:
    """The ``tp_size`` the stock ``_schedule_verify_lens`` passes to the
    group function: the planner's server args where it keeps them (0.5.16),
    else the parallel context (0.5.17, 0.5.18)."""
    args = vars(planner).get("server_args")
    size = getattr(args, "tp_size", None)
    if isinstance(size, int):
        return size
    return int(module.get_parallel().tp_size)


def overlap_on(planner: Any, module: Any) -> bool:
    """Whether this planner runs under the overlap scheduler: its server
    args where it keeps them (0.5.16), else the schedule context (0.5.17
    on). False where neither says."""
    args = vars(planner).get("server_args")
    flag = getattr(args, "disable_overlap_schedule", None)
    if flag is None:
        try:
            flag = module.get_schedule().disable_overlap_schedule
        except Exception:
            return False
    return not flag


def broadcast_group(planner: Any, module: Any, shape: str) -> Any:
    """The group this planner's ``verify_lens`` broadcast runs on, looked up
    where and when the stock code looks it up (None: not found)."""
    if shape == SHAPE_FUNCTION:
        found = getattr(module, GROUP_FUNCTION)(tp_size=_tp_size(planner, module))
        group, size = found
        if not isinstance(getattr(group, "world_size", None), int):
            # A group description without its own size: the function's.
            return _Sized(group, int(size))
        return group
    sync = vars(planner).get(TP_SYNC_ATTR)
    return None if sync is None else getattr(sync, TP_SYNC_GROUP, None)


class _Sized:
    """A group object and the size its lookup function reported."""

    def __init__(self, group: Any, size: int) -> None:
        self.group = group
        self.world_size = size
        self.cpu_group = getattr(group, "cpu_group", None)


def schedules_budget(planner: Any) -> bool:
    """Whether this planner schedules a per-step verify budget that picks
    verify lengths (a budget planner, not verify-all)."""
    return bool(planner.schedules_verify_budget) and not bool(planner.is_verify_all)


def mode_of(planner: Any) -> str:
    """The planner's ragged-verify mode (``static``, ``cap-accept``,
    ``compact``)."""
    return str(planner.mode_value)


def note_no_budget(planner: Any) -> None:
    """What the stock method does when it has no budget this step (its
    budget planner forgets the last decision)."""
    planner.note_non_decode_step()


# --------------------------------------------------------------------------
# Building a planner on CPU (probe and harness).
# --------------------------------------------------------------------------


def ragged_mode(mode: str) -> Any:
    """SGLang's ``RaggedVerifyMode`` member for ``mode``."""
    enum = importlib.import_module(RAGGED_MODULE).RaggedVerifyMode
    return enum(mode)


def profiled_sps_table(probes: list[tuple[int, float]], max_batch_tokens: int) -> Any:
    """A profiled (non-flat) SPS cost table, built by SGLang's assembler."""
    sps = importlib.import_module(SPS_MODULE)
    return sps.profile_sps_table(probes=probes, max_batch_tokens=max_batch_tokens)


def sps_table_json(table: Any) -> str:
    return table.to_json()


def runtime_swaps(
    module: Any,
    *,
    runtime: Any,
    group: Any,
    mode: str | None = None,
    sps_table: Any = None,
) -> AttrSwap:
    """For a ``with`` block: the planner module's global names answer from
    ``runtime`` (one namespace standing in for the server args, the parallel
    context and the config bags), ``group`` is the TP group, DP attention is
    off and, where given, the ragged-verify mode is ``mode`` (else SGLang
    reads ``SGLANG_RAGGED_VERIFY_MODE``) and the SPS table loader returns
    ``sps_table`` (else it reads the configured path). Only names the module
    has are swapped; what the planner does with them is unchanged."""
    answers: dict[str, Any] = {
        "get_parallel": lambda: runtime,
        "get_schedule": lambda: runtime,
        "get_spec": lambda: runtime,
        "get_disagg": lambda: runtime,
        "get_tp_group": lambda: group,
        "is_dp_attention_enabled": lambda: False,
    }
    if mode is not None:
        answers["read_ragged_verify_mode"] = lambda: ragged_mode(mode)
    if sps_table is not None:
        answers["load_sps_table_from_path"] = lambda _path: sps_table
    swaps = [
        (module, name, value)
        for name, value in answers.items()
        if callable(getattr(module, name, None))
    ]
    return AttrSwap(*swaps)


def build_planner(
    module: Any,
    cls: type,
    *,
    draft_model: Any,
    model_runner: Any,
    runtime: Any,
    group: Any,
    gamma: int,
    verify_num_draft_tokens: int,
    tp_rank: int = 0,
) -> Any:
    """The installed ``DSparkVerifyPlanner``, built by its own constructor
    with the arguments its signature asks for (call it inside
    :func:`runtime_swaps`). ``runtime`` stands in for the server args where
    the release takes them; where it takes a ``SpecTpSync`` instead, a real
    one is built on ``group``."""
    known: dict[str, Any] = {
        "draft_model": draft_model,
        "gamma": gamma,
        "model_runner": model_runner,
        "device": "cpu",
        "tp_rank": tp_rank,
        "server_args": runtime,
        "verify_num_draft_tokens": verify_num_draft_tokens,
    }
    sig = inspect.signature(cls.__init__)
    kwargs: dict[str, Any] = {}
    for name, param in list(sig.parameters.items())[1:]:
        if name == "tp_sync":
            sync_cls = getattr(module, TP_SYNC_CLASS, None)
            if not isinstance(sync_cls, type):
                raise DidNotEnable(
                    f"{PLANNER} takes tp_sync but {PLANNER_MODULE} has no "
                    f"{TP_SYNC_CLASS}"
                )
            kwargs[name] = sync_cls(group)
        elif name in known:
            kwargs[name] = known[name]
        elif param.default is inspect.Parameter.empty and param.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            raise DidNotEnable(
                f"{PLANNER}.__init__ needs {name!r}, which this plugin does not "
                "know how to provide on CPU"
            )
    return cls(**kwargs)


def bind_budget(planner: Any, fn: Any) -> AttrSwap:
    """For a ``with`` block: this planner instance (only) calls ``fn`` as its
    budget method (``fn(planner, **kwargs)``)."""

    def budget(**kwargs: Any) -> Any:
        return fn(planner, **kwargs)

    return AttrSwap((planner, BUDGET, budget))


def graph_tier(
    module: Any,
    *,
    bs: int,
    budget: int | None,
    verify_num_draft_tokens: int,
    capture_num_tokens: list[int],
) -> int | None:
    """The verify graph tier SGLang's own helpers give ``bs`` requests under
    ``budget`` (the planner's dynamic-tier rule; None: no budget)."""
    if budget is None:
        return None
    total = module.local_verify_tier_num_tokens(
        bs=bs,
        verify_token_budget=budget,
        verify_num_draft_tokens=verify_num_draft_tokens,
        min_verify_len=1,
    )
    grid = importlib.import_module(RAGGED_MODULE).round_up_grid
    return int(grid(total, capture_num_tokens))


def relay_lag_steps(module_name: str = RELAY_MODULE) -> tuple[int, int]:
    """``(lag, depth)`` of the installed confidence relay's ring."""
    overlap = importlib.import_module(module_name)
    return int(getattr(overlap, RELAY_LAG)), int(getattr(overlap, RELAY_DEPTH))


def relay_on_cpu(
    *, pool: Any, req_pool_size: int, gamma: int, events: list[Any]
) -> Any:
    """The installed ``ConfidenceRelay``, its host ring set up on CPU the
    way its lazy init sets it up on CUDA (a ring of ``depth`` confidence and
    generation slots, one copy-done event each), with ``events`` standing in
    for the CUDA events."""
    import torch

    overlap = importlib.import_module(RELAY_MODULE)
    relay_cls = getattr(overlap, RELAY, None)
    if not isinstance(relay_cls, type):
        raise DidNotEnable(f"{RELAY_MODULE} has no {RELAY}")
    _lag, depth = relay_lag_steps()
    if len(events) != depth:
        raise ValueError(f"the relay ring has {depth} slots, got {len(events)} events")
    relay = relay_cls(
        device=torch.device("cpu"), req_pool_size=req_pool_size, pool=pool
    )
    relay.initialized = True
    relay.confidence_buf = torch.zeros((req_pool_size, gamma), dtype=torch.float32)
    relay.conf_ring = torch.zeros((depth, req_pool_size, gamma), dtype=torch.float32)
    relay.gen_ring = torch.zeros((depth, req_pool_size), dtype=torch.int64)
    relay.copy_done = list(events)
    return relay


def relay_slot(relay: Any) -> int:
    """The ring slot the relay's next copy goes to."""
    _lag, depth = relay_lag_steps()
    return int(relay.ring_pos) % depth


def installed_class(module_name: str, name: str) -> type | None:
    """An installed SGLang class by module and name (None: not there)."""
    try:
        found = getattr(importlib.import_module(module_name), name, None)
    except ImportError:
        return None
    return found if isinstance(found, type) else None


def load_relay() -> tuple[Any, type]:
    """``(overlap_utils module, ConfidenceRelay)``, or DidNotEnable."""
    try:
        module = importlib.import_module(RELAY_MODULE)
    except ImportError as exc:
        raise DidNotEnable(
            f"the installed SGLang has no {RELAY_MODULE} ({exc})"
        ) from exc
    cls = getattr(module, RELAY, None)
    if not isinstance(cls, type):
        raise DidNotEnable(f"{RELAY_MODULE} has no class {RELAY}")
    fn = cls.__dict__.get(RESOLVE)
    if not callable(fn):
        raise DidNotEnable(f"{RELAY}.{RESOLVE} is not there (renamed target?)")
    params = [
        p for p in inspect.signature(inspect.unwrap(fn)).parameters if p != "self"
    ]
    if tuple(params) != RESOLVE_PARAMS:
        raise DidNotEnable(
            f"{RELAY}.{RESOLVE} has an unexpected signature ({', '.join(params)})"
        )
    for name in (RELAY_LAG, RELAY_DEPTH):
        if not isinstance(getattr(module, name, None), int):
            raise DidNotEnable(f"{RELAY_MODULE} has no {name} (renamed?)")
    return module, cls


def stock_resolve(cls: type) -> Any:
    """``resolve`` as the installed SGLang wrote it, under any applied hook."""
    return inspect.unwrap(cls.__dict__[RESOLVE])


def resolve_signature(cls: type) -> inspect.Signature:
    return inspect.signature(stock_resolve(cls))


def pending_copy(relay: Any, batch: Any, stream: Any, publish_ready: Any) -> Any:
    """The copy-done event of the ring slot ``resolve`` reads on the overlap
    path, where that copy has not landed yet (None: resolve had another
    reason to answer None: no relay yet, no draft input, no rows, the
    non-overlap path, or a ring not yet ``lag`` steps deep)."""
    if stream is None or publish_ready is None or not relay.initialized:
        return None
    spec_info = getattr(batch, "spec_info", None)
    rows = None if spec_info is None else getattr(spec_info, "future_indices", None)
    if rows is None or rows.shape[0] == 0:
        return None
    lag, depth = relay_lag_steps()
    if relay.ring_pos < lag:
        return None
    event = relay.copy_done[(relay.ring_pos - lag) % depth]
    return None if event.query() else event


def relay_ring_slot(relay: Any, slot: int) -> tuple[Any, Any]:
    """``(confidence, generation)`` rows of one ring slot."""
    return relay.conf_ring[slot], relay.gen_ring[slot]


def set_relay_position(relay: Any, ring_pos: int) -> None:
    relay.ring_pos = int(ring_pos)


def resolved_values(resolved: Any) -> tuple[Any, Any]:
    """``(confidence, generation)`` of what ``resolve`` returned."""
    return resolved.confidence, resolved.generation


#: The planner's per-step layout decision: it takes the step's budget,
#: enters the ``verify_lens`` broadcast, and returns the layout whose graph
#: tier the worker runs.
LAYOUT = "schedule_layout"
LAYOUT_TARGET = f"{PLANNER_MODULE}.{PLANNER}.{LAYOUT}"
#: The group method the ``verify_lens`` broadcast calls.
GROUP_BROADCAST = "broadcast"


def layout_tier(layout: Any) -> int | None:
    """The verify graph tier (tokens) a layout runs (None: no layout)."""
    if layout is None:
        return None
    tokens = getattr(layout, "graph_num_tokens", None)
    return None if tokens is None else int(tokens)


def group_object(found: Any) -> Any:
    """The group object :func:`broadcast_group` found (under the size its
    lookup function reported, where it wrapped one)."""
    return found.group if isinstance(found, _Sized) else found
