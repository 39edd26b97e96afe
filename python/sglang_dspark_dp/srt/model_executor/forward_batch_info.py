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
  vectors live in one persistent per-proposer buffer updated in place
  (:class:`DraftDPBuffers`);
* a changed step issues one host-to-device copy, from pinned memory with
  ``non_blocking=True`` (the host never waits for queued GPU work), and no
  kernel launch.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import torch

from sglang_dspark_dp.adapter import base as memory

logger = logging.getLogger("sglang_dspark_dp")

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
    """Persistent device buffers of one draft proposer, fed from one packed
    host buffer.

    Device layout: one int64 tensor of ``1 + 2 * dp`` elements. Element 0's
    first four bytes are ``non_padded``, the int32 device scalar; elements
    ``1 .. dp`` are ``global_num_tokens_gpu`` and the next ``dp`` its
    logprob twin (``rows``). The views are the same tensor objects, at the
    same addresses, for as long as the DP size holds (CUDA graphs capture
    addresses); a new DP size (which a server never sees: its DP size is
    fixed at launch) or the first counts after scalar-only steps lay out a
    new tensor, scalar included.

    A changed step writes its values into a pinned host buffer of the same
    layout and issues ONE asynchronous copy of the whole of it: no kernel
    launch, no device allocation, no host wait. Two host buffers alternate,
    so the host never rewrites a buffer whose copy may still be in flight:
    an event recorded after each copy says when a buffer is free again;
    the buffer about to be reused was last copied two changed steps ago, so
    that event has long completed unless the host runs more than a whole
    step ahead of the GPU, and only then does the host wait for it
    (``host_waits`` counts those waits). On a device without pinned memory
    (CPU) the copy is synchronous and no event is needed. The host buffers
    of a CUDA device are asked for page-locked and checked to be so
    (``pinned``): from pageable memory a "non-blocking" copy makes the host
    wait, the stall this path exists to remove, so a buffer that comes back
    pageable is said in a warning, never silently.

    Steady state: a write whose inputs equal the previous write's issues no
    device work at all, provided nothing wrote the tensor in place since
    (the views share their base's version counter, which every in-place
    torch op bumps). SGLang does write these tensors in place on some paths
    (``ForwardBatch.prepare_mlp_sync_batch`` copies padded counts into
    ``global_num_tokens_gpu`` on an eager DP step, and fills
    ``num_token_non_padded`` for a dummy extend), so the counter, not the
    values alone, decides.
    """

    __slots__ = (
        "device",
        "non_padded",
        "rows",
        "host_waits",
        "_dp",
        "_dev",
        "_hosts",
        "_events",
        "_next",
        "_pin",
        "pinned",
        "_event_factory",
        "_want",
        "_seen",
    )

    #: How many host buffers alternate.
    DEPTH = 2

    def __init__(
        self,
        device: Any,
        *,
        with_non_padded: bool = False,
        event_factory: Any = None,
    ) -> None:
        """``event_factory``: makes the event recorded after each copy
        (``torch.cuda.Event`` on a CUDA device, none elsewhere; a test
        passes a stand-in)."""
        self.device = torch.device(device)
        self.non_padded: torch.Tensor | None = None
        self.rows: tuple[torch.Tensor, torch.Tensor] | None = None
        self.host_waits = 0
        self._dp: int | None = None
        self._dev: torch.Tensor | None = None
        self._hosts: list[tuple[torch.Tensor, Any, Any]] = []
        self._events: list[Any] = []
        self._next = 0
        self._pin = memory.pins_host_memory(self.device)
        #: Whether every host buffer is page-locked (None: none made yet).
        self.pinned: bool | None = None
        if event_factory is None and self._pin:
            event_factory = torch.cuda.Event
        self._event_factory = event_factory
        # The values the device buffer is to hold: (non-padded, counts, logprob).
        self._want: tuple[int, tuple[int, ...], tuple[int, ...]] = (0, (), ())
        self._seen: tuple[Any, int] | None = None
        if with_non_padded:
            self._layout(0)

    def _layout(self, dp: int) -> None:
        import numpy as np

        # Normal tensors (not inference tensors), so that in-place updates
        # work whether or not the step runs under torch.inference_mode().
        with torch.inference_mode(False):
            dev = torch.zeros(1 + 2 * dp, dtype=torch.int64, device=self.device)
            self._hosts = []
            for _ in range(self.DEPTH):
                host = memory.host_buffer(1 + 2 * dp, torch.int64, pinned=self._pin)
                words = host.numpy()
                self._hosts.append((host, words, words.view(np.int32)))
        self.pinned = all(memory.is_pinned(h[0]) for h in self._hosts)
        if self._pin and not self.pinned:
            logger.warning(
                "sglang-dspark-dp: draft-batch: the fill's host buffers for %s "
                "are pageable although page-locked memory was asked for: each "
                "changed step's copy makes the host wait for the GPU",
                self.device,
            )
        self._events = [None] * self.DEPTH
        self._next = 0
        self._dev = dev
        self._dp = dp
        self.non_padded = dev[:1].view(torch.int32)[0]
        self.rows = (dev[1 : 1 + dp], dev[1 + dp :])
        self._seen = None

    def host_tensors(self) -> list[torch.Tensor]:
        """The host buffers the copies come from (to check their memory)."""
        return [h[0] for h in self._hosts]

    def update(
        self,
        non_padded: int | None = None,
        counts: Sequence[int] | None = None,
        logprob_counts: Sequence[int] | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """Make the device views hold this step's values; ``None`` keeps a
        part's previous value. Returns ``(non_padded, rows)``.

        On a change: the values into the free host buffer, one asynchronous
        copy of it. On a repeat: nothing at all."""
        want_np, want_counts, want_logprob = self._want
        if non_padded is not None:
            want_np = non_padded
        if counts is not None:
            want_counts, want_logprob = tuple(counts), tuple(logprob_counts or ())
            if len(want_logprob) != len(want_counts):
                raise ValueError(
                    f"logprob_counts has {len(want_logprob)} ranks, "
                    f"counts {len(want_counts)}"
                )
        want = (want_np, want_counts, want_logprob)
        self._want = want
        dp = len(want_counts)
        dev = self._dev
        if dev is None or dp != self._dp:
            self._layout(dp)
            dev = self._dev
        seen = self._seen
        if seen is not None and seen[0] == want and seen[1] == dev._version:
            return self.non_padded, self.rows  # type: ignore[return-value]
        idx = self._next
        event = self._events[idx]
        if event is not None and not event.query():
            # Still being copied from: the host ran a whole step ahead.
            event.synchronize()
            self.host_waits += 1
        host, words, halves = self._hosts[idx]
        halves[0] = want_np
        words[1 : 1 + dp] = want_counts
        words[1 + dp :] = want_logprob
        dev.copy_(host, non_blocking=self._pin)
        if self._event_factory is not None:
            if event is None:
                event = self._events[idx] = self._event_factory()
            if self._pin:
                event.record(memory.current_stream(self.device))
            else:
                event.record()
        self._next = (idx + 1) % self.DEPTH
        self._seen = (want, dev._version)
        return self.non_padded, self.rows  # type: ignore[return-value]

    def set_non_padded(self, num_tokens: int) -> torch.Tensor:
        """The device scalar holding ``num_tokens``."""
        return self.update(non_padded=num_tokens)[0]

    def stage_counts(
        self, counts: Sequence[int], logprob_counts: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Both per-rank vectors in the persistent device buffer."""
        return self.update(counts=counts, logprob_counts=logprob_counts)[1]


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
    write_np = NON_PADDED in groups
    if write_np:
        num_tokens = forward_batch.input_ids.numel()
        setattr(forward_batch, names.non_padded_cpu, num_tokens)

    raw = batch.global_num_tokens
    dp = dp_moe_sync and raw is not None
    counts = logprob_counts = None
    if dp and SCALED in groups:
        raw_logprob = batch.global_num_tokens_for_logprob
        if honours_coordination and batch.dp_spec_prefill_coordination_applied:
            counts, logprob_counts = raw, raw_logprob
        else:
            counts, logprob_counts = scale(spec_info, raw, raw_logprob)

    # One call, so that a changed step issues one copy for all of it.
    device_np = write_np and device_count
    if device_np or counts is not None:
        scalar, (gpu, gpu_logprob) = buffers.update(
            num_tokens if device_np else None, counts, logprob_counts
        )
        if device_np:
            setattr(forward_batch, names.non_padded, scalar)
    if not dp:
        return

    if UNSCALED in groups:
        setattr(forward_batch, names.unscaled, raw)

    if counts is not None:
        setattr(forward_batch, names.scaled_cpu, counts)
        setattr(forward_batch, names.scaled_logprob_cpu, logprob_counts)
        setattr(forward_batch, names.scaled_gpu, gpu)
        setattr(forward_batch, names.scaled_logprob_gpu, gpu_logprob)
        setattr(forward_batch, names.dp_graph_ok, getattr(batch, names.dp_graph_ok))
