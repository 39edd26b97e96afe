"""CUDA-graph admission: the decode capture sizes and the state of a
``DecodeCudaGraphRunner`` that ``can_run_graph`` reads."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def capture_sizes(max_bs: int) -> list[int]:
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


def graph_runner(api: Any, *, dp_size: int, width: int, capture_bs: list[int]) -> Any:
    """A real ``DecodeCudaGraphRunner`` object whose ``can_run_graph`` decides
    admission as the draft's runner would under DP attention (``dp_size > 1``:
    ``require_mlp_tp_gather`` and ``require_mlp_sync`` on, as ``__init__``
    derives them for a MoE draft without ``--moe-dense-tp-size``) or attention
    TP (``dp_size == 1``: both off). Made without ``__init__``, which captures
    graphs from a loaded model; only what ``can_run_graph`` reads is set."""
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    runner = DecodeCudaGraphRunner.__new__(DecodeCudaGraphRunner)
    dp_attention = dp_size > 1
    runner.__dict__.update(
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
    return runner
