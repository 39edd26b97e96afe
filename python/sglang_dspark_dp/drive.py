"""Drive a real ``DraftBlockProposer`` on CPU, no GPU, no model.

The proposer's own ``_run_forward`` (ranks with requests) and
``run_idle_participation`` (ranks without) build the draft ``ForwardBatch``
exactly as in a server; only the draft runner is a stand-in. It records the
batch it receives and hands it to a real ``DecodeCudaGraphRunner``'s
``can_run_graph`` for the admission decision. That runner object is made
without its ``__init__`` (which captures CUDA graphs from a loaded model);
the few attributes ``can_run_graph`` reads are set to what ``__init__``
derives for DSpark's MoE draft under the given topology.

Used by the plugin's probe, the regression suite, the lockstep harness and
the benchmarks, so all of them exercise the same installed code.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
from types import SimpleNamespace
from typing import Any

import torch

from sglang_dspark_dp.srt.speculative.dspark_worker import (
    SGLangAPI,
    build_draft_proposer,
    make_schedule_batch,
)

HIDDEN = 8
VOCAB = 32


def capture_sizes(max_bs: int = 128) -> list[int]:
    """The decode CUDA-graph batch sizes SGLang captures with speculative
    decoding on and ``--cuda-graph-max-bs-decode max_bs``, from SGLang's own
    generator (its location moved between releases)."""
    args = SimpleNamespace(
        disable_cuda_graph_padding=False, speculative_algorithm="DSPARK"
    )
    try:
        from sglang.srt.arg_groups.cuda_graph_hook import (
            generate_decode_cuda_graph_batch_sizes as gen,
        )
    except ImportError:
        from sglang.srt.server_args import ServerArgs

        return sorted(ServerArgs._generate_decode_cuda_graph_batch_sizes(args, max_bs))
    try:
        return sorted(gen(args, max_bs))
    except Exception:
        from sglang.srt.server_args import ServerArgs

        full = ServerArgs.__new__(ServerArgs)
        full.__dict__.update(vars(args))
        return sorted(gen(full, max_bs))


def graph_runner(
    api: SGLangAPI, *, dp_size: int, width: int, capture_bs: list[int]
) -> Any:
    """A real ``DecodeCudaGraphRunner`` object whose ``can_run_graph`` decides
    admission as the draft's runner would under DP attention (``dp_size > 1``:
    ``require_mlp_tp_gather`` and ``require_mlp_sync`` on, as ``__init__``
    derives them for a MoE draft without ``--moe-dense-tp-size``) or attention
    TP (``dp_size == 1``: both off)."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    runner = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    dp_attention = dp_size > 1
    state = dict(
        ragged_verify_mode=False,
        captured_req_width=width,
        require_mlp_tp_gather=dp_attention,
        require_attn_tp_gather=False,
        require_gathered_buffer=dp_attention,
        require_mlp_sync=dp_attention,
        enable_pdmux=False,
        disable_padding=False,
        capture_bs=list(capture_bs),
        max_bs=max(capture_bs),
        is_encoder_decoder=False,
        capture_hidden_mode=api.capture_hidden_mode.NULL,
        enable_two_batch_overlap=False,
        record_nolora_graph=False,
        model_runner=SimpleNamespace(spec_algorithm=api.spec_algorithm.DSPARK),
    )
    runner.__dict__.update(state)
    return runner


def padded_bs(capture_bs: list[int], bs: int) -> int | None:
    """The capture size a replay of ``bs`` pads to (None: larger than all)."""
    i = bisect.bisect_left(capture_bs, bs)
    return capture_bs[i] if i < len(capture_bs) else None


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


def snapshot(forward_batch: Any, names: Any) -> dict[str, Any]:
    """Copy of the DP/EP fields (device values read back: CPU use only)."""
    if names is None:
        return {}
    out: dict[str, Any] = {}
    for f in dataclasses.fields(names):
        name = getattr(names, f.name)
        if name is None:
            continue
        value = getattr(forward_batch, name, None)
        if isinstance(value, torch.Tensor):
            value = (value.dtype, value.device, value.detach().cpu().tolist())
        elif isinstance(value, list):
            value = list(value)
        out[f.name] = value
    return out


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
        return int(self.proposer._draft_block_spec_info.num_tokens_per_req)

    def step(
        self,
        bs: int,
        global_num_tokens: list[int] | None,
        can_run_dp_cuda_graph: bool = True,
    ) -> Seen | None:
        """Run this rank's draft forward of one decode step: the busy path if
        ``bs > 0``, else the idle path. Returns what the runner saw (None: the
        stock idle path sent nothing). The stock exception propagates."""
        seq_lens = torch.full((bs,), 16, dtype=torch.int64, device=self.device)
        batch = make_schedule_batch(
            self.api,
            seq_lens=seq_lens,
            global_num_tokens=global_num_tokens,
            can_run_dp_cuda_graph=can_run_dp_cuda_graph,
        )
        return self.step_batch(bs, batch)

    def step_batch(self, bs: int, batch: Any) -> Seen | None:
        """:meth:`step` with the target's ``ScheduleBatch`` given."""
        before = self.runner.forwards
        if bs == 0:
            self.proposer.run_idle_participation(batch)
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
            self.proposer._run_forward(
                batch=batch,
                draft_input=draft_input,
                verify_window=verify_window,
                bs=bs,
                device=self.device,
                embed_module=self.embed,
            )
        return self.runner.seen[-1] if self.runner.forwards > before else None
