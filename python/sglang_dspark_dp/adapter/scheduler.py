"""The scheduler: its DP sync writer ``_update_gather_batch``, which
writes the all-gathered sync sizes into a ``ScheduleBatch``, and
``Scheduler.run_batch``, whose non-overlap speculative branch calls the
DSpark worker's ``forward_batch_generation``."""

from __future__ import annotations

import importlib
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.outcome import DidNotEnable

#: The SGLang function that writes the all-gathered sync sizes into a
#: ``ScheduleBatch`` (what the scheduler runs after its DP all-gather).
SYNC_WRITER = "sglang.srt.managers.scheduler_components.dp_attn._update_gather_batch"
_SYNC_WRITER_NAME = SYNC_WRITER.rpartition(".")[2]


SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
SCHEDULER = "Scheduler"
RUN_BATCH = "run_batch"
#: The scheduler module's helper that resolves a batch's inputs before the
#: forward (it needs a live future map; a stand-in step skips it).
RESOLVE_INPUTS = "resolve_forward_inputs"
#: The keyword the non-overlap branch passes on some releases.
PP_KWARG = "pp_proxy_tensors"
#: The scheduler's own state and method ``run_batch`` reads: whether it
#: idled since the last batch, and the context a forward runs in.
SCHED_IDLED = "_sched_idled"
FORWARD_ISOLATION = "_forward_isolation"


def load_scheduler() -> tuple[Any, type]:
    """``(scheduler module, Scheduler)``, or DidNotEnable saying why."""
    try:
        module = importlib.import_module(SCHEDULER_MODULE)
    except ImportError as exc:
        raise DidNotEnable(f"cannot import {SCHEDULER_MODULE} ({exc})") from exc
    cls = getattr(module, SCHEDULER, None)
    if not isinstance(cls, type) or not callable(getattr(cls, RUN_BATCH, None)):
        raise DidNotEnable(f"{SCHEDULER_MODULE} has no {SCHEDULER}.{RUN_BATCH}")
    return module, cls


def no_input_resolution(module: Any) -> Any:
    """For a ``with`` block: the scheduler module's input resolution is a
    no-op (a stand-in batch has no future map to resolve against)."""
    from sglang_dspark_dp.adapter.base import AttrSwap

    if not callable(getattr(module, RESOLVE_INPUTS, None)):
        return AttrSwap()
    return AttrSwap((module, RESOLVE_INPUTS, lambda *a, **k: None))


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
