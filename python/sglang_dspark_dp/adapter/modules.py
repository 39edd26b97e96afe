"""The SGLang modules whose first import arms a repair, named once: the
adapter's subsystem modules take their names from here, and the registry
reads them without loading the rest of the adapter."""

from __future__ import annotations

#: DSpark's draft block proposer.
DRAFT_MODULE = "sglang.srt.speculative.dspark_components.dspark_draft"
#: DSpark's verify planner (the user of the scheduler's ConfidenceRelay).
PLANNER_MODULE = "sglang.srt.speculative.dspark_components.dspark_planner"
#: ``SpecTpSync`` (0.5.19+).
SYNC_MODULE = "sglang.srt.speculative.spec_tp_sync"
#: DSpark's worker: imported where, and only where, DSpark runs.
WORKER_MODULE = "sglang.srt.speculative.dspark_components.dspark_worker_v2"
