"""The suite's oracle: what each DP/EP field of one rank's draft batch must
hold, from the meaning the fixing release gives it (0.5.17's fill, #33098,
and SGLang's ``spec_scale_global_num_tokens``, unchanged 0.5.16-0.5.23).

It is computed from the step's inputs alone (this rank's requests, the
draft block's two widths, the rows the scheduler all-gathered, SGLang's
switch for the device count), never from a fill's output and never from
``sglang_dspark_dp.expectations`` (the plugin's own statement, which this
one must be able to contradict). It imports no SGLang, so the unit tests
share it.

Keys are the logical keys of ``DraftDPFieldNames`` (the installed field
names are the caller's business). A device field is given as the tensor it
must equal (values, dtype, device); ``None``: the field stays unset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class Step:
    """One rank's draft step, as SGLang hands it to the fill."""

    #: This rank's requests (0: an idle rank).
    requests: int
    #: Draft tokens per request (the spec info's ``num_tokens_per_req``).
    width: int
    #: Logprob tokens per request (its ``num_tokens_for_logprob_per_req``).
    logprob_width: int
    #: The scheduler's all-gathered per-rank rows (``global_num_tokens`` and
    #: ``global_num_tokens_for_logprob``); None: no DP attention.
    counts: Sequence[int] | None
    logprob_counts: Sequence[int] | None
    #: SGLang's ``enable_num_token_non_padded()`` under this topology.
    device_count: bool
    #: The draft runner's device.
    device: Any = "cpu"
    #: The scheduler's DP graph verdict (None: not stated).
    graph_ok: bool | None = None
    #: The rows are in draft-token units already: SGLang's DP prefill
    #: coordination scaled them, on a release whose scheduler applies it.
    coordinated: bool = False

    @classmethod
    def of(cls, spec_info: Any, **inputs: Any) -> Step:
        """A step whose widths are those of the draft block's spec info."""
        return cls(
            width=int(spec_info.num_tokens_per_req),
            logprob_width=int(spec_info.num_tokens_for_logprob_per_req),
            **inputs,
        )


def expected(step: Step) -> dict[str, Any]:
    """What each field must hold after the fill of ``step``."""
    tokens = step.requests * step.width
    device = torch.device(step.device)
    want: dict[str, Any] = {
        # This rank's real draft tokens, host int and (where SGLang wants
        # it: EP MoE masking and accounting) an int32 scalar on the device.
        "non_padded_cpu": tokens,
        "non_padded": (
            torch.tensor(tokens, dtype=torch.int32, device=device)
            if step.device_count
            else None
        ),
    }
    if step.counts is None:  # no DP attention: no DP metadata
        return want | dict.fromkeys(
            (
                "unscaled",
                "scaled_cpu",
                "scaled_gpu",
                "scaled_logprob_cpu",
                "scaled_logprob_gpu",
            )
        )
    if step.logprob_counts is None or len(step.logprob_counts) != len(step.counts):
        raise ValueError("the scheduler gathers one logprob count per DP rank")
    if step.coordinated:
        scaled, scaled_logprob = list(step.counts), list(step.logprob_counts)
    else:
        scaled = [c * step.width for c in step.counts]
        scaled_logprob = [c * step.logprob_width for c in step.logprob_counts]
    want |= {
        # The raw per-rank request counts: the graph bucket is keyed on them.
        "unscaled": list(step.counts),
        # The rows in this forward's token units, host lists and int64
        # vectors on the device, the logprob row by its own width.
        "scaled_cpu": scaled,
        "scaled_gpu": torch.tensor(scaled, dtype=torch.int64, device=device),
        "scaled_logprob_cpu": scaled_logprob,
        "scaled_logprob_gpu": torch.tensor(
            scaled_logprob, dtype=torch.int64, device=device
        ),
    }
    if step.graph_ok is not None:
        want["dp_graph_ok"] = step.graph_ok
    return want


def logprob_row(counts: Sequence[int] | None) -> list[int] | None:
    """The logprob row the sweeps hand the fill beside ``counts``: on each
    rank half its requests (rounded down) count for logprobs, so the row
    differs from the token row on every busy rank and a fill that mixes
    the two rows up shows. (A decode step's row equals its request row;
    a round where a peer prefills does not; either way the fill scales
    whatever row the scheduler gathered.)"""
    return None if counts is None else [c // 2 for c in counts]


def held(value: Any) -> Any:
    """A field's contents in one comparable form: a tensor, or a tensor as
    observed (anything with ``dtype``, ``device`` and ``value``), becomes
    ``(values, dtype, device)``; anything else is itself."""
    if isinstance(value, torch.Tensor):
        return (value.tolist(), value.dtype, value.device)
    if all(hasattr(value, a) for a in ("dtype", "device", "value")):
        return (value.value, value.dtype, torch.device(value.device))
    return value


def by_key(obj: Any, names: Any) -> dict[str, Any]:
    """The DP/EP fields of ``obj`` by logical key; ``names`` (a
    ``DraftDPFieldNames``) gives the installed field of each key."""
    return {
        f.name: getattr(obj, getattr(names, f.name), None)
        for f in dataclasses.fields(names)
        if getattr(names, f.name) is not None
    }


def mismatches(fields: dict[str, Any], step: Step) -> dict[str, tuple[Any, Any]]:
    """Every key of :func:`expected` whose field in ``fields`` (by logical
    key) holds something else: ``{key: (got, want)}``."""
    out = {}
    for key, want in expected(step).items():
        got = held(fields.get(key))
        if got != held(want):
            out[key] = (got, held(want))
    return out
