"""DP/EP metadata of a hand-built draft ``ForwardBatch``.

Counterpart of ``sglang/srt/model_executor/forward_batch_info.py``:
``ForwardBatch.init_new`` derives the DP-attention sync sizes and the
non-padded token counts from the scheduler's batch; DSpark's draft worker
builds its draft batch by hand and, on affected releases, misses some of them.
:func:`derive_draft_dp_metadata` is the single place in this package that
derives those fields for such a batch. Everything else (the hooks, the
harness, the benchmarks) calls it.

Hot-path rules (it runs on every rank at every decode step):

* no host<->device synchronisation: nothing reads a device tensor;
* no device allocation per step: the non-padded count and the per-rank count
  vectors live in persistent per-proposer buffers updated in place
  (:class:`DraftDPBuffers`);
* a host-to-device copy is only ever issued from pinned memory with
  ``non_blocking=True``, so the host never waits for queued GPU work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

#: Field groups :func:`derive_draft_dp_metadata` can write.
UNSCALED = "unscaled"  # original_global_num_tokens_cpu
SCALED = "scaled"  # global_num_tokens*_cpu/_gpu + can_run_dp_cuda_graph
NON_PADDED = "non_padded"  # the device scalar and the host int

ALL_GROUPS = frozenset({UNSCALED, SCALED, NON_PADDED})


@dataclasses.dataclass(frozen=True)
class DraftDPFieldNames:
    """Names of the installed ``ForwardBatch``'s fields for each quantity.

    SGLang renamed some of them over time (``num_token_non_padded`` became
    ``global_num_token_non_padded`` once a rank-local copy was split off;
    ``can_run_dp_cuda_graph`` became ``can_run_decode_cuda_graph``), so they
    are resolved once from the installed class. ``None``: not declared.
    """

    unscaled: str | None = "original_global_num_tokens_cpu"
    non_padded: str | None = "num_token_non_padded"
    non_padded_cpu: str | None = "num_token_non_padded_cpu"
    scaled_cpu: str | None = "global_num_tokens_cpu"
    scaled_gpu: str | None = "global_num_tokens_gpu"
    scaled_logprob_cpu: str | None = "global_num_tokens_for_logprob_cpu"
    scaled_logprob_gpu: str | None = "global_num_tokens_for_logprob_gpu"
    dp_graph_ok: str | None = "can_run_dp_cuda_graph"

    @classmethod
    def for_forward_batch(cls, forward_batch_cls: type) -> DraftDPFieldNames:
        declared = {f.name for f in dataclasses.fields(forward_batch_cls)}
        wanted = {f.name: getattr(cls, f.name) for f in dataclasses.fields(cls)}
        if "global_num_token_non_padded" in declared:
            wanted["non_padded"] = "global_num_token_non_padded"
            wanted["non_padded_cpu"] = "global_num_token_non_padded_cpu"
        return cls(**{k: (v if v in declared else None) for k, v in wanted.items()})

    def missing(self, *keys: str) -> list[str]:
        """The keys among ``keys`` the installed ``ForwardBatch`` lacks."""
        return [k for k in keys if getattr(self, k) is None]


class DraftDPBuffers:
    """Persistent device buffers of one draft proposer.

    ``non_padded`` is the int32 device scalar (allocated once, only where
    SGLang's ``enable_num_token_non_padded()`` holds). ``counts`` holds the
    scaled per-rank vectors, row 0 for ``global_num_tokens_gpu`` and row 1
    for the logprob variant; it is (re)allocated only when the DP size
    changes, i.e. once.
    """

    __slots__ = ("device", "non_padded", "_counts", "_rows", "_pin")

    def __init__(self, device: Any, *, with_non_padded: bool) -> None:
        self.device = torch.device(device)
        # Normal tensors (not inference tensors), so that in-place updates
        # work whether or not the step runs under torch.inference_mode().
        with torch.inference_mode(False):
            self.non_padded = (
                torch.zeros((), dtype=torch.int32, device=self.device)
                if with_non_padded
                else None
            )
        self._counts: torch.Tensor | None = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._pin = self.device.type == "cuda"

    def stage_counts(
        self, counts: Sequence[int], logprob_counts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write both per-rank vectors into the persistent device buffer.

        One pinned host tensor, one asynchronous copy: the host does not
        wait for the stream, and the device allocates nothing.
        """
        n = len(counts)
        if self._counts is None or self._counts.shape[1] != n:
            with torch.inference_mode(False):
                self._counts = torch.zeros(
                    (2, n), dtype=torch.int64, device=self.device
                )
                self._rows = (self._counts[0], self._counts[1])
        host = torch.tensor(
            (counts, logprob_counts), dtype=torch.int64, pin_memory=self._pin
        )
        self._counts.copy_(host, non_blocking=self._pin)
        return self._rows  # type: ignore[return-value]


def derive_draft_dp_metadata(
    forward_batch: Any,
    batch: Any,
    *,
    spec_info: Any,
    dp_moe_sync: bool,
    buffers: DraftDPBuffers,
    groups: frozenset[str],
    names: DraftDPFieldNames,
    scale: Any,
) -> None:
    """Fill the DP/EP metadata of a hand-built draft batch in place.

    ``forward_batch`` is the draft ``ForwardBatch``; ``batch`` the target's
    ``ScheduleBatch`` of the step (its ``global_num_tokens`` are the raw
    per-rank request counts the scheduler all-gathered). ``groups`` says
    which field groups to write (the rest is left to SGLang's own fill);
    ``scale`` is SGLang's ``spec_scale_global_num_tokens``.

    * ``non_padded``: this rank's real draft tokens (``input_ids.numel()``,
      i.e. batch size x draft block width; 0 on an idle rank) as the device
      int32 scalar (only where ``buffers.non_padded`` exists, i.e. EP > 1)
      and as a host int. Written on every path, DP attention or not.
    * ``unscaled``: ``original_global_num_tokens_cpu`` = the raw per-rank
      request counts, which ``DecodeCudaGraphRunner.can_run_graph`` keys the
      graph bucket on. DP-attention path only.
    * ``scaled``: the per-rank counts in draft-token units (cpu lists, the
      persistent device vectors) and ``can_run_dp_cuda_graph``. Passed
      through unscaled where SGLang's DP prefill coordination already did so.
    """
    if NON_PADDED in groups:
        num_tokens = forward_batch.input_ids.numel()
        device_count = buffers.non_padded
        if device_count is not None:
            device_count.fill_(num_tokens)
            setattr(forward_batch, names.non_padded, device_count)
        setattr(forward_batch, names.non_padded_cpu, num_tokens)

    raw = batch.global_num_tokens
    if not dp_moe_sync or raw is None:
        return

    if UNSCALED in groups:
        setattr(forward_batch, names.unscaled, raw)

    if SCALED in groups:
        raw_logprob = batch.global_num_tokens_for_logprob
        if getattr(batch, "dp_spec_prefill_coordination_applied", False):
            counts, logprob_counts = raw, raw_logprob
        else:
            counts, logprob_counts = scale(spec_info, raw, raw_logprob)
        gpu, gpu_logprob = buffers.stage_counts(counts, logprob_counts)
        setattr(forward_batch, names.scaled_cpu, counts)
        setattr(forward_batch, names.scaled_logprob_cpu, logprob_counts)
        setattr(forward_batch, names.scaled_gpu, gpu)
        setattr(forward_batch, names.scaled_logprob_gpu, gpu_logprob)
        setattr(forward_batch, names.dp_graph_ok, batch.can_run_dp_cuda_graph)
