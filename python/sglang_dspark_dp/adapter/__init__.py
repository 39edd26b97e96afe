"""Every SGLang-private name the plugin touches, one module per SGLang
subsystem.

Everything this package reads or writes inside the installed SGLang that is
not a documented API goes through here; when a release renames something,
the module named after that subsystem is the one to read:

* :mod:`.draft`: DSpark's ``DraftBlockProposer`` and the functions its fill
  calls;
* :mod:`.worker`: ``DSparkWorkerV2``'s startup (capture group, free-memory
  reading, platform checks);
* :mod:`.hooks`: ``HookRegistry``'s bookkeeping;
* :mod:`.parallel`: the parallel context's override fields;
* :mod:`.scheduler`: the scheduler's DP sync writer;
* :mod:`.cuda_graph`: capture sizes and a ``DecodeCudaGraphRunner``'s state;
* :mod:`.checker`: SGLang's own rank consensus checker (0.5.19+);
* :mod:`.base`: what they share (finding a DSpark class, reading a
  signature, swapping attributes).

SGLang is imported at call time, so importing the adapter never imports
SGLang. The names most callers use are re-exported here, each loaded on
first use (PEP 562), so a process that only arms the repairs loads only the
adapter modules that name what arms them.
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each re-exported name and the adapter module that defines it.
_HOMES: dict[str, str] = {
    "AttrSwap": "base",
    "current_stream": "base",
    "host_buffer": "base",
    "is_pinned": "base",
    "pins_host_memory": "base",
    "dspark_class": "base",
    "signature_of": "base",
    "capture_sizes": "cuda_graph",
    "graph_runner": "cuda_graph",
    "DRAFT_MODULE": "draft",
    "FILL": "draft",
    "PROPOSER": "draft",
    "SGLangAPI": "draft",
    "TARGET": "draft",
    "dp_moe_sync": "draft",
    "draft_spec_info": "draft",
    "draft_width": "draft",
    "load_sglang_api": "draft",
    "run_busy_forward": "draft",
    "run_idle_forward": "draft",
    "stock_fill": "draft",
    "sync_group": "draft",
    "takes_dp_sync": "draft",
    "add_around": "hooks",
    "apply_hooks": "hooks",
    "forget_loaded_plugins": "hooks",
    "hook_origins": "hooks",
    "hook_registry": "hooks",
    "hooks_on": "hooks",
    "is_patched": "hooks",
    "load_plugins": "hooks",
    "register_around": "hooks",
    "remove_hook": "hooks",
    "GroupShape": "parallel",
    "accepted_parallel_fields": "parallel",
    "dp_rank_and_size": "parallel",
    "group_coordinator": "parallel",
    "parallel_override": "parallel",
    "topology_values": "parallel",
    "SYNC_WRITER": "scheduler",
    "SyncPathFailed": "scheduler",
    "load_sync_writer": "scheduler",
    "write_sync_sizes": "scheduler",
    "CAPTURE_CUTOFF_GIB": "worker",
    "CAPTURE_GROUP_SOURCES": "worker",
    "INIT_GRAPHS": "worker",
    "MEMORY_HELPER": "worker",
    "MEMORY_HELPER_HOMES": "worker",
    "STARTUP_TARGET": "worker",
    "WORKER": "worker",
    "WORKER_MODULE": "worker",
    "DRAFT_CAPTURE_ARG": "worker",
    "DRAFT_INIT_GRAPHS": "worker",
    "capture_decision": "worker",
    "capture_group": "worker",
    "dp_attention_on": "worker",
    "folded_site": "worker",
    "draft_worker_of": "worker",
    "hosts_draft": "worker",
    "injected_free_memory": "worker",
    "load_worker": "worker",
    "memory_helper_sites": "worker",
    "pretend_cuda": "worker",
    "reads_through_spec_tp_sync": "worker",
    "reduced_module_reading": "worker",
    "stock_init_graphs": "worker",
    "tp_sync_of": "worker",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])
