"""Builders of real SGLang objects: a draft proposer and its two batches.

A real ``DraftBlockProposer`` (arguments newer signatures add and the DP
fill does not use get neutral values), a real ``ScheduleBatch`` carrying
what the draft path reads, and a real ``ForwardBatch`` shaped like the
proposer's hand-built draft batch.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import torch

from sglang_dspark_dp.adapter import PROPOSER, SGLangAPI
from sglang_dspark_dp.outcome import DidNotEnable

# Arguments newer DraftBlockProposer.__init__ signatures require that the
# fill does not depend on.
_INIT_FILLERS: dict[str, Any] = {
    "tp_sync": None,
    "random_seed": 0,
    "greedy_draft": True,
}


class DeviceOnlyRunner:
    """The least a draft runner must be for the fill alone: a device."""

    def __init__(self, device: Any) -> None:
        self.device = device


def build_draft_proposer(
    api: SGLangAPI,
    *,
    draft_model_runner: Any,
    gamma: int,
    dp_moe_sync: bool,
    draft_model: Any = None,
    mask_token_id: int = 0,
    spec_info: Any = None,
) -> Any:
    """A real ``DraftBlockProposer`` wired to ``draft_model_runner``; an
    unknown required argument is a DidNotEnable naming it."""
    if spec_info is None:
        spec_info = api.make_spec_info(
            draft_token_num=gamma, device=draft_model_runner.device
        )
    if draft_model is None:
        draft_model = SimpleNamespace(
            sample_from_anchor=True, forward_embed=None, confidence_head=None
        )
    kwargs: dict[str, Any] = dict(
        draft_model=draft_model,
        draft_model_runner=draft_model_runner,
        gamma=gamma,
        mask_token_id=mask_token_id,
        draft_block_spec_info=spec_info,
        dp_moe_sync=dp_moe_sync,
    )
    sig = inspect.signature(api.proposer_cls.__init__)
    for name, param in sig.parameters.items():
        if name == "self" or name in kwargs:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in _INIT_FILLERS:
            kwargs[name] = _INIT_FILLERS[name]
        elif param.default is param.empty:
            raise DidNotEnable(
                f"{PROPOSER}.__init__ requires an unexpected argument {name!r}"
            )
    missing = [k for k in kwargs if k not in sig.parameters]
    if missing and not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
        raise DidNotEnable(f"{PROPOSER}.__init__ no longer takes {missing}")
    return api.proposer_cls(**kwargs)


def make_schedule_batch(
    api: SGLangAPI,
    *,
    seq_lens: torch.Tensor,
    global_num_tokens: list[int] | None,
    can_run_dp_cuda_graph: bool = True,
    global_num_tokens_for_logprob: list[int] | None = None,
) -> Any:
    """A real ``ScheduleBatch`` carrying what the draft path reads; the
    logprob row is the token row unless given (a decode step's)."""
    batch = api.schedule_batch_cls(reqs=[])
    bs = int(seq_lens.numel())
    batch.seq_lens = seq_lens
    batch.seq_lens_cpu = seq_lens.cpu()
    batch.req_pool_indices = torch.arange(bs, dtype=torch.int64, device=seq_lens.device)
    batch.global_num_tokens = global_num_tokens
    if global_num_tokens_for_logprob is None and global_num_tokens is not None:
        global_num_tokens_for_logprob = global_num_tokens
    batch.global_num_tokens_for_logprob = (
        None
        if global_num_tokens_for_logprob is None
        else list(global_num_tokens_for_logprob)
    )
    batch.can_run_dp_cuda_graph = can_run_dp_cuda_graph
    if hasattr(batch, "can_run_decode_cuda_graph"):
        batch.can_run_decode_cuda_graph = can_run_dp_cuda_graph
    return batch


def make_draft_forward_batch(
    api: SGLangAPI, *, bs: int, width: int, spec_info: Any, device: Any
) -> Any:
    """A real ``ForwardBatch`` shaped like the hand-built draft batch."""
    n = bs * width
    ids = torch.zeros((n,), dtype=torch.int64, device=device)
    seq_lens = torch.full((bs,), 8, dtype=torch.int64, device=device)
    return api.forward_batch_cls(
        forward_mode=(api.forward_mode.TARGET_VERIFY if bs else api.forward_mode.IDLE),
        batch_size=bs,
        input_ids=ids,
        req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
        seq_lens=seq_lens,
        out_cache_loc=ids.clone(),
        seq_lens_sum=8 * bs,
        seq_lens_cpu=seq_lens.cpu(),
        positions=ids.clone(),
        spec_algorithm=api.spec_algorithm.DSPARK,
        spec_info=spec_info,
        capture_hidden_mode=api.capture_hidden_mode.NULL,
    )
