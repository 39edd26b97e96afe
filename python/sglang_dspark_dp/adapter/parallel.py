"""The parallel context: a rank's topology through
``get_parallel().override(...)`` and the override keys it accepts."""

from __future__ import annotations

import importlib
from contextlib import AbstractContextManager
from typing import Any


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
        "pp_size": 1,  # DSpark runs with one pipeline stage
        "pp_rank": 0,
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


def dp_rank_and_size(api: Any, default_size: int) -> tuple[int | None, int]:
    """This process's DP-attention rank and size (rank None: no parallel
    state, as in tools and unit tests)."""
    try:
        par = api.get_parallel()
        return int(par.attn_dp_rank), int(par.attn_dp_size)
    except Exception:
        return None, default_size


#: SGLang's process-group wrapper (``GroupCoordinator``).
COORDINATOR = ("sglang.srt.distributed.parallel_state", "GroupCoordinator")


def group_coordinator(
    group_ranks: list[list[int]], *, local_rank: int, name: str, timeout: Any
) -> Any | None:
    """SGLang's own ``GroupCoordinator`` over gloo (device and CPU groups both
    gloo, no device communicator) for this process's group among
    ``group_ranks``; every rank calls it with the same groups, in the same
    order. ``timeout`` bounds its CPU group (a barrier or a collective that
    a peer never enters). None where the installed class cannot be built
    that way (an argument this plugin does not know how to give)."""
    import inspect

    try:
        module = importlib.import_module(COORDINATOR[0])
    except ImportError:
        return None
    cls = getattr(module, COORDINATOR[1], None)
    if not isinstance(cls, type):
        return None
    known = {
        "group_ranks": [list(r) for r in group_ranks],
        "local_rank": local_rank,
        "torch_distributed_backend": "gloo",
        "group_name": name,
        "gloo_timeout": timeout,
    }
    kwargs: dict[str, Any] = {}
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if "gloo_timeout" not in {p.name for p in params}:
        return None  # its CPU group would wait for hours on a missing peer
    for p in params:
        if p.name in known:
            kwargs[p.name] = known[p.name]
        elif p.name.startswith("use_"):
            kwargs[p.name] = False
        elif p.default is inspect.Parameter.empty and p.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ):
            return None
    return cls(**kwargs)
