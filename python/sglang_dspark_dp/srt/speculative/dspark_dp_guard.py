"""Opt-in runtime guard for the DP/EP metadata of DSpark's draft batch.

Turned on with ``SGLANG_DSPARK_DP_CHECK=1`` (read once, when the draft-batch
repair is instrumented; off, the hook does not even call this module). It
runs right after the fill, before the batch reaches the draft runner, asks
:mod:`sglang_dspark_dp.expectations` whether the batch is correct, and
raises :class:`DSparkDPMetadataError` naming the field, the rank and the
values of the first gap. It never reads a device tensor's value, so it adds
no host-device sync.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_dspark_dp import adapter, expectations, settings
from sglang_dspark_dp.settings import GUARD_ENV

logger = logging.getLogger("sglang_dspark_dp")


def guard_enabled() -> bool:
    """Whether ``SGLANG_DSPARK_DP_CHECK`` turns the guard on (a value that
    is neither on nor off means off, and says so once)."""
    return settings.switch(GUARD_ENV, meaning="the guard stays off")


class DSparkDPMetadataError(RuntimeError):
    """A draft batch's DP/EP metadata is inconsistent."""

    def __init__(self, field: str, rank: int | None, detail: str, value: Any):
        self.field = field
        self.rank = rank
        self.value = value
        where = "?" if rank is None else str(rank)
        super().__init__(
            f"DSpark draft batch: {field} on DP rank {where}: {detail} (got {value!r})"
        )


def check_draft_batch(
    proposer: Any, forward_batch: Any, batch: Any, *, names: Any, api: Any
) -> None:
    """Validate ``forward_batch`` (filled from the target's ``batch``)."""
    raw = batch.global_num_tokens
    dp = adapter.dp_moe_sync(proposer) and raw is not None
    rank, size = adapter.dp_rank_and_size(api, len(raw) if raw is not None else 1)
    want = expectations.expect(
        tokens=forward_batch.input_ids.numel(),
        counts=list(raw) if dp else None,
        width=int(forward_batch.spec_info.num_tokens_per_req),
        device_count=api.enable_num_token_non_padded(),
        device=proposer.draft_model_runner.device,
        coordinated=bool(getattr(batch, "dp_spec_prefill_coordination_applied", 0)),
        dp_size=size,
        rank=rank,
    )
    observed = expectations.observe(forward_batch, names, read_device=False)
    gaps = expectations.check(observed, want)
    if gaps:
        gap = gaps[0]
        raise DSparkDPMetadataError(getattr(names, gap.key), rank, gap.why, gap.got)
