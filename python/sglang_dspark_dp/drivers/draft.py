"""One DP rank's real ``DraftBlockProposer`` driven on CPU, no GPU, no model.

The proposer's own busy-rank and idle-rank forwards build the draft
``ForwardBatch`` exactly as in a server; only the draft runner is a
stand-in. It records the batch it receives (:class:`Seen`) and hands it to a
real ``DecodeCudaGraphRunner.can_run_graph`` for the admission decision.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from types import SimpleNamespace
from typing import Any

import torch

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import SGLangAPI, capture_sizes, graph_runner
from sglang_dspark_dp.drivers.builders import build_draft_proposer, make_schedule_batch
from sglang_dspark_dp.expectations import observe

__all__ = [
    "DraftDriver",
    "RecordingDraftRunner",
    "Seen",
    "capture_sizes",
    "graph_runner",
    "padded_bs",
    "snapshot",
]

HIDDEN = 8
VOCAB = 32


def padded_bs(capture_bs: list[int], bs: int) -> int | None:
    """The capture size a replay of ``bs`` pads to (None: larger than all)."""
    i = bisect.bisect_left(capture_bs, bs)
    return capture_bs[i] if i < len(capture_bs) else None


def snapshot(forward_batch: Any, names: Any) -> dict[str, Any]:
    """The DP/EP fields, device values read back (CPU use only)."""
    if names is None:
        return {}
    return observe(forward_batch, names, read_device=True)


@dataclasses.dataclass
class Seen:
    """What the draft runner received in one forward, copied at that moment
    (the persistent buffers change on the next step)."""

    forward_batch: Any
    admitted: bool | None
    error: BaseException | None
    fields: dict[str, Any]


class _NoOpTranslator:
    def bind_own_plan(self, *args: Any, **kwargs: Any) -> None:
        return None


class RecordingDraftRunner:
    """Stand-in for the draft ``ModelRunner``: records the batch, asks the
    real ``can_run_graph``, returns zero hidden states of the right shape."""

    def __init__(self, device: Any = "cpu", graph: Any = None, names: Any = None):
        self.device = device
        self.decode_cuda_graph_runner = graph
        self.names = names
        self.attn_backend = SimpleNamespace(needs_cpu_seq_lens=True)
        self.kv_index_translator = _NoOpTranslator()
        self.seen: collections.deque[Seen] = collections.deque(maxlen=64)
        self.forwards = 0

    def forward(self, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
        admitted, error = None, None
        if self.decode_cuda_graph_runner is not None:
            try:
                admitted = bool(
                    self.decode_cuda_graph_runner.can_run_graph(forward_batch)
                )
            except Exception as exc:
                error = exc
        self.forwards += 1
        self.seen.append(
            Seen(forward_batch, admitted, error, snapshot(forward_batch, self.names))
        )
        if error is not None:
            raise error
        n = forward_batch.input_ids.numel()
        hidden = torch.zeros((n, HIDDEN), device=forward_batch.input_ids.device)
        return SimpleNamespace(
            logits_output=SimpleNamespace(hidden_states=hidden),
            can_run_graph=bool(admitted),
        )


class DraftDriver:
    """One DP rank's real proposer plus its recording runner."""

    def __init__(
        self,
        api: SGLangAPI,
        *,
        gamma: int,
        dp_moe_sync: bool,
        graph: Any = None,
        names: Any = None,
        device: Any = "cpu",
    ) -> None:
        self.api = api
        self.gamma = gamma
        self.device = device
        self.runner = RecordingDraftRunner(device, graph, names)
        self.proposer = build_draft_proposer(
            api,
            draft_model_runner=self.runner,
            gamma=gamma,
            dp_moe_sync=dp_moe_sync,
            draft_model=SimpleNamespace(sample_from_anchor=True, confidence_head=None),
        )
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN).to(device)

    @property
    def width(self) -> int:
        return adapter.draft_width(self.proposer)

    @property
    def spec_info(self) -> Any:
        return adapter.draft_spec_info(self.proposer)

    def step(
        self,
        bs: int,
        global_num_tokens: list[int] | None,
        can_run_dp_cuda_graph: bool = True,
        global_num_tokens_for_logprob: list[int] | None = None,
    ) -> Seen | None:
        """Run this rank's draft forward of one decode step: the busy path if
        ``bs > 0``, else the idle path. Returns what the runner saw (None: the
        stock idle path sent nothing). The stock exception propagates. The
        scheduler's logprob row is its token row unless given."""
        seq_lens = torch.full((bs,), 16, dtype=torch.int64, device=self.device)
        batch = make_schedule_batch(
            self.api,
            seq_lens=seq_lens,
            global_num_tokens=global_num_tokens,
            can_run_dp_cuda_graph=can_run_dp_cuda_graph,
            global_num_tokens_for_logprob=global_num_tokens_for_logprob,
        )
        return self.step_batch(bs, batch)

    def step_batch(self, bs: int, batch: Any) -> Seen | None:
        """:meth:`step` with the target's ``ScheduleBatch`` given."""
        before = self.runner.forwards
        if bs == 0:
            adapter.run_idle_forward(self.proposer, batch)
        else:
            width = self.width
            grid = torch.arange(bs * (width + 1), device=self.device).view(
                bs, width + 1
            )
            verify_window = SimpleNamespace(
                positions_2d=grid,
                verify_cache_loc_2d=grid,
                kv_loc_plan=SimpleNamespace(bind=lambda *a, **k: None),
            )
            draft_input = SimpleNamespace(
                bonus_tokens=torch.ones((bs,), dtype=torch.int64, device=self.device),
                reserved_seq_lens_cpu=None,
                nxt_kv_lens_cpu=None,
            )
            adapter.run_busy_forward(
                self.proposer,
                batch=batch,
                draft_input=draft_input,
                verify_window=verify_window,
                bs=bs,
                device=self.device,
                embed_module=self.embed,
            )
        return self.runner.seen[-1] if self.runner.forwards > before else None
