"""Opt-in runtime guard for the DP/EP metadata of DSpark's draft batch.

Turned on with ``SGLANG_DSPARK_DP_CHECK=1`` (read once, when the plugin is
instrumented; off, the hook does not even call this module). It runs right
after the fill, before the batch reaches the draft runner, and raises
:class:`DSparkDPMetadataError` naming the field, the rank and the values.
It never reads a device tensor's value, so it adds no host-device sync.
"""

from __future__ import annotations

from typing import Any

import torch


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


def _dp_rank_and_size(api: Any, default_size: int) -> tuple[int | None, int]:
    try:
        par = api.get_parallel()
        return int(par.attn_dp_rank), int(par.attn_dp_size)
    except Exception:  # parallel state not initialised (tools, tests)
        return None, default_size


def _check_list(field: str, value: Any, size: int, rank: int | None) -> list[int]:
    if not isinstance(value, (list, tuple)):
        raise DSparkDPMetadataError(field, rank, "expected a per-rank list", value)
    if len(value) != size:
        raise DSparkDPMetadataError(
            field, rank, f"expected one entry per DP rank ({size})", value
        )
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise DSparkDPMetadataError(
                field, rank, "entries must be non-negative ints", value
            )
    return list(value)


def check_draft_batch(
    proposer: Any, forward_batch: Any, batch: Any, *, names: Any, api: Any
) -> None:
    """Validate ``forward_batch`` (filled from the target's ``batch``)."""
    raw = batch.global_num_tokens
    dp = bool(proposer._dp_moe_sync) and raw is not None
    rank, size = _dp_rank_and_size(api, len(raw) if raw is not None else 1)
    num_tokens = forward_batch.input_ids.numel()
    device = torch.device(proposer.draft_model_runner.device)

    cpu_count = getattr(forward_batch, names.non_padded_cpu)
    if isinstance(cpu_count, bool) or not isinstance(cpu_count, int) or cpu_count < 0:
        raise DSparkDPMetadataError(
            names.non_padded_cpu, rank, "expected a non-negative int", cpu_count
        )
    if cpu_count > num_tokens:
        raise DSparkDPMetadataError(
            names.non_padded_cpu,
            rank,
            f"exceeds the padded token count {num_tokens}",
            cpu_count,
        )
    if api.enable_num_token_non_padded():
        dev_count = getattr(forward_batch, names.non_padded)
        if not isinstance(dev_count, torch.Tensor):
            raise DSparkDPMetadataError(
                names.non_padded, rank, "expected a device int32 scalar", dev_count
            )
        if dev_count.dtype != torch.int32 or dev_count.numel() != 1:
            raise DSparkDPMetadataError(
                names.non_padded,
                rank,
                "expected one int32 element",
                (dev_count.dtype, tuple(dev_count.shape)),
            )
        if dev_count.device != device and not (
            device.type == dev_count.device.type and device.index is None
        ):
            raise DSparkDPMetadataError(
                names.non_padded,
                rank,
                f"expected on the draft runner's device {device}",
                dev_count.device,
            )
    if not dp:
        return

    unscaled = _check_list(
        names.unscaled, getattr(forward_batch, names.unscaled), size, rank
    )
    scaled = _check_list(
        names.scaled_cpu, getattr(forward_batch, names.scaled_cpu), size, rank
    )
    _check_list(
        names.scaled_logprob_cpu,
        getattr(forward_batch, names.scaled_logprob_cpu),
        size,
        rank,
    )
    if not getattr(batch, "dp_spec_prefill_coordination_applied", False):
        width = proposer._draft_block_spec_info.num_tokens_per_req
        want = [u * width for u in unscaled]
        if scaled != want:
            raise DSparkDPMetadataError(
                names.scaled_cpu,
                rank,
                f"expected unscaled x draft block width {width} = {want}",
                scaled,
            )
    if rank is not None and 0 <= rank < size and cpu_count > scaled[rank]:
        raise DSparkDPMetadataError(
            names.non_padded_cpu,
            rank,
            f"exceeds this rank's padded count {scaled[rank]}",
            cpu_count,
        )
