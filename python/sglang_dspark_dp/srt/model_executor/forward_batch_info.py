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
        if "can_run_dp_cuda_graph" not in declared:
            wanted["dp_graph_ok"] = "can_run_decode_cuda_graph"
        return cls(**{k: (v if v in declared else None) for k, v in wanted.items()})

    def missing(self, *keys: str) -> list[str]:
        """The keys among ``keys`` the installed ``ForwardBatch`` lacks."""
        return [k for k in keys if getattr(self, k) is None]


class DraftDPBuffers:
    """Persistent device buffers of one draft proposer.

    ``non_padded`` is the int32 device scalar (allocated on the first step
    where SGLang's ``enable_num_token_non_padded()`` holds). ``counts``
    holds the scaled per-rank vectors, row 0 for ``global_num_tokens_gpu``
    and row 1 for the logprob variant; it is (re)allocated only when the DP
    size changes, i.e. once.

    Steady state: a write whose inputs equal the previous write's issues no
    device work at all, provided nothing wrote the tensor in place since
    (its version counter, which every in-place torch op bumps, is what the
    previous write left). SGLang does write these tensors in place on some
    paths (``ForwardBatch.prepare_mlp_sync_batch`` copies padded counts into
    ``global_num_tokens_gpu`` on an eager DP step, and fills
    ``num_token_non_padded`` for a dummy extend), so the counter, not the
    values alone, decides.
    """

    __slots__ = (
        "device",
        "non_padded",
        "_counts",
        "_rows",
        "_pin",
        "_np_seen",
        "_counts_seen",
    )

    def __init__(self, device: Any, *, with_non_padded: bool = False) -> None:
        self.device = torch.device(device)
        self.non_padded: torch.Tensor | None = None
        self._counts: torch.Tensor | None = None
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self._pin = self.device.type == "cuda"
        self._np_seen: tuple[int, int] | None = None
        self._counts_seen: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
        if with_non_padded:
            self._scalar()

    def _scalar(self) -> torch.Tensor:
        # Normal tensors (not inference tensors), so that in-place updates
        # work whether or not the step runs under torch.inference_mode().
        with torch.inference_mode(False):
            self.non_padded = torch.zeros((), dtype=torch.int32, device=self.device)
        self._np_seen = None
        return self.non_padded

    def set_non_padded(self, num_tokens: int) -> torch.Tensor:
        """The device scalar holding ``num_tokens`` (written only if it does
        not hold it already)."""
        scalar = self.non_padded
        if scalar is None:
            scalar = self._scalar()
        seen = self._np_seen
        if seen is None or seen[0] != num_tokens or seen[1] != scalar._version:
            scalar.fill_(num_tokens)
            self._np_seen = (num_tokens, scalar._version)
        return scalar

    def stage_counts(
        self, counts: Sequence[int], logprob_counts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both per-rank vectors in the persistent device buffer.

        On a change: one pinned host tensor, one asynchronous copy (the host
        does not wait for the stream, the device allocates nothing). On a
        repeat: nothing at all.
        """
        key = (tuple(counts), tuple(logprob_counts))
        buf = self._counts
        seen = self._counts_seen
        if (
            seen is not None
            and buf is not None
            and seen[0] == key[0]
            and seen[1] == key[1]
            and seen[2] == buf._version
        ):
            return self._rows  # type: ignore[return-value]
        n = len(key[0])
        if buf is None or buf.shape[1] != n:
            with torch.inference_mode(False):
                buf = torch.zeros((2, n), dtype=torch.int64, device=self.device)
            self._counts = buf
            self._rows = (buf[0], buf[1])
        host = torch.tensor(key, dtype=torch.int64, pin_memory=self._pin)
        buf.copy_(host, non_blocking=self._pin)
        self._counts_seen = (key[0], key[1], buf._version)
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
    device_count: bool,
    honours_coordination: bool = False,
) -> None:
    """Fill the DP/EP metadata of a hand-built draft batch in place.

    ``forward_batch`` is the draft ``ForwardBatch``; ``batch`` the target's
    ``ScheduleBatch`` of the step (its ``global_num_tokens`` are the raw
    per-rank request counts the scheduler all-gathered). ``groups`` says
    which field groups to write (the rest is left to SGLang's own fill);
    ``scale`` is SGLang's ``spec_scale_global_num_tokens`` and ``spec_info``
    the draft block's spec info the stock fill scales with.
    ``device_count``: SGLang's ``enable_num_token_non_padded()`` this step.
    ``honours_coordination``: the installed stock fill passes the counts
    through unscaled where SGLang's DP prefill coordination already scaled
    them (``batch.dp_spec_prefill_coordination_applied``); only then is that
    flag read.

    * ``non_padded``: this rank's real draft tokens (``input_ids.numel()``,
      i.e. batch size x draft block width; 0 on an idle rank) as the device
      int32 scalar (only where ``device_count``) and as a host int. Written
      on every path, DP attention or not.
    * ``unscaled``: ``original_global_num_tokens_cpu`` = the raw per-rank
      request counts, which ``DecodeCudaGraphRunner.can_run_graph`` keys the
      graph bucket on. DP-attention path only.
    * ``scaled``: the per-rank counts in draft-token units (cpu lists, the
      persistent device vectors) and the batch's DP graph flag.
    """
    if NON_PADDED in groups:
        num_tokens = forward_batch.input_ids.numel()
        if device_count:
            setattr(forward_batch, names.non_padded, buffers.set_non_padded(num_tokens))
        setattr(forward_batch, names.non_padded_cpu, num_tokens)

    raw = batch.global_num_tokens
    if not dp_moe_sync or raw is None:
        return

    if UNSCALED in groups:
        setattr(forward_batch, names.unscaled, raw)

    if SCALED in groups:
        raw_logprob = batch.global_num_tokens_for_logprob
        if honours_coordination and batch.dp_spec_prefill_coordination_applied:
            counts, logprob_counts = raw, raw_logprob
        else:
            counts, logprob_counts = scale(spec_info, raw, raw_logprob)
        gpu, gpu_logprob = buffers.stage_counts(counts, logprob_counts)
        setattr(forward_batch, names.scaled_cpu, counts)
        setattr(forward_batch, names.scaled_logprob_cpu, logprob_counts)
        setattr(forward_batch, names.scaled_gpu, gpu)
        setattr(forward_batch, names.scaled_logprob_gpu, gpu_logprob)
        setattr(forward_batch, names.dp_graph_ok, getattr(batch, names.dp_graph_ok))
