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
* :mod:`.base`: what they share (finding a DSpark class, reading a
  signature, swapping attributes).

SGLang is imported at call time, so importing the adapter never imports
SGLang. The names most callers use are re-exported here.
"""

from __future__ import annotations

from sglang_dspark_dp.adapter.base import (
    AttrSwap,
    current_stream,
    dspark_class,
    host_buffer,
    is_pinned,
    pins_host_memory,
    signature_of,
)
from sglang_dspark_dp.adapter.cuda_graph import capture_sizes, graph_runner
from sglang_dspark_dp.adapter.draft import (
    DRAFT_MODULE,
    FILL,
    PROPOSER,
    TARGET,
    SGLangAPI,
    dp_moe_sync,
    draft_spec_info,
    draft_width,
    load_sglang_api,
    run_busy_forward,
    run_idle_forward,
    stock_fill,
)
from sglang_dspark_dp.adapter.hooks import (
    apply_hooks,
    forget_loaded_plugins,
    hook_registry,
    hooks_on,
    is_patched,
    load_plugins,
    register_around,
    remove_hook,
)
from sglang_dspark_dp.adapter.parallel import (
    GroupShape,
    accepted_parallel_fields,
    dp_rank_and_size,
    group_coordinator,
    parallel_override,
    topology_values,
)
from sglang_dspark_dp.adapter.scheduler import (
    SYNC_WRITER,
    SyncPathFailed,
    load_sync_writer,
    write_sync_sizes,
)
from sglang_dspark_dp.adapter.worker import (
    CAPTURE_CUTOFF_GIB,
    CAPTURE_GROUP_SOURCES,
    INIT_GRAPHS,
    MEMORY_HELPER,
    MEMORY_HELPER_HOMES,
    STARTUP_TARGET,
    WORKER,
    WORKER_MODULE,
    capture_group,
    hosts_draft,
    injected_free_memory,
    load_worker,
    memory_helper_sites,
    pretend_cuda,
    reads_through_spec_tp_sync,
    reduced_module_reading,
    stock_init_graphs,
    tp_sync_of,
)

__all__ = [
    "AttrSwap",
    "CAPTURE_CUTOFF_GIB",
    "CAPTURE_GROUP_SOURCES",
    "DRAFT_MODULE",
    "FILL",
    "GroupShape",
    "INIT_GRAPHS",
    "MEMORY_HELPER",
    "MEMORY_HELPER_HOMES",
    "PROPOSER",
    "STARTUP_TARGET",
    "SGLangAPI",
    "SYNC_WRITER",
    "SyncPathFailed",
    "TARGET",
    "WORKER",
    "WORKER_MODULE",
    "accepted_parallel_fields",
    "apply_hooks",
    "capture_group",
    "capture_sizes",
    "current_stream",
    "dp_moe_sync",
    "dp_rank_and_size",
    "draft_spec_info",
    "draft_width",
    "dspark_class",
    "forget_loaded_plugins",
    "graph_runner",
    "group_coordinator",
    "hook_registry",
    "hooks_on",
    "hosts_draft",
    "injected_free_memory",
    "is_patched",
    "load_plugins",
    "load_sglang_api",
    "load_sync_writer",
    "load_worker",
    "memory_helper_sites",
    "parallel_override",
    "pretend_cuda",
    "reads_through_spec_tp_sync",
    "reduced_module_reading",
    "register_around",
    "remove_hook",
    "run_busy_forward",
    "run_idle_forward",
    "host_buffer",
    "is_pinned",
    "pins_host_memory",
    "signature_of",
    "stock_fill",
    "stock_init_graphs",
    "topology_values",
    "tp_sync_of",
    "write_sync_sizes",
]
