"""The installed DSpark draft API: ``DraftBlockProposer`` (its fill, its
busy and idle forwards, its private state) and the SGLang functions the
fill calls."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

from sglang_dspark_dp.adapter.base import dspark_class
from sglang_dspark_dp.adapter.modules import DRAFT_MODULE
from sglang_dspark_dp.outcome import DidNotEnable

PROPOSER = "DraftBlockProposer"
FILL = "_fill_dp_moe_sync_metadata"
#: The draft-batch repair's hook target (``HookRegistry`` spelling).
TARGET = f"{DRAFT_MODULE}.{PROPOSER}.{FILL}"
#: SGLang's switch for the device non-padded count (the fill calls it).
NON_PADDED_SWITCH = "enable_num_token_non_padded"
#: SGLang's scaling of per-rank counts into draft-token units.
SCALE = "spec_scale_global_num_tokens"


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
        fn = getattr(self.draft_module, NON_PADDED_SWITCH, None)
        if fn is None:
            fn = getattr(self.fbi_module, NON_PADDED_SWITCH)
        return bool(fn())

    def scale(self, spec_info: Any, counts: Any, logprob_counts: Any) -> Any:
        fn = getattr(self.draft_module, SCALE, None)
        if fn is None:
            fn = getattr(self.spec_module, SCALE)
        return fn(spec_info, counts, logprob_counts)

    def draft_module_offers(self) -> tuple[tuple[Any, str, Any], ...]:
        """SGLang functions the repaired fill calls that the draft module
        does not import on this release (0.5.16 lacks
        ``enable_num_token_non_padded`` there): ``(module, name, function)``
        to offer while instrumented, so a unit test patching the name in
        the draft module, as later releases' tests do, reaches the repair."""
        homes = ((NON_PADDED_SWITCH, self.fbi_module), (SCALE, self.spec_module))
        return tuple(
            (self.draft_module, name, getattr(home, name))
            for name, home in homes
            if not hasattr(self.draft_module, name)
        )


def load_sglang_api() -> SGLangAPI:
    """Import what the draft-batch repair needs, or raise DidNotEnable."""
    draft, proposer_cls = dspark_class(DRAFT_MODULE, PROPOSER, "draft")
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
        getattr(fbi, NON_PADDED_SWITCH)
        getattr(spec, SCALE)
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


def sync_group(proposer: Any) -> Any:
    """The group the DP sync sizes of this proposer's batches were gathered
    over: its draft runner's TP group (the whole DP-attention world, as
    SGLang's ``ModelRunner`` keeps it); None where it has none."""
    runner = getattr(proposer, "draft_model_runner", None)
    return getattr(runner, "tp_group", None)


def takes_dp_sync(proposer: Any, batch: Any) -> bool:
    """Whether the fill writes DP sync sizes for ``batch`` (the stock fill's
    own condition: the DP/EP sync path, and sizes gathered)."""
    return (
        dp_moe_sync(proposer) and getattr(batch, "global_num_tokens", None) is not None
    )
