"""What a correct DSpark draft batch is: the one statement of it.

The probe (which fields does the stock fill leave wrong?), the opt-in
runtime guard, the lockstep harness and the benchmarks all ask
:func:`check`; each turns the :class:`Gap` list into its own verdict (a
repair plan, an exception, a failed step, a table cell). The regression
suite keeps its own, independent oracle.

A draft batch of one rank, built for ``tokens`` draft tokens (batch size x
draft block width; 0 on an idle rank), is correct when:

* ``non_padded_cpu`` is ``tokens`` (a host int);
* where SGLang wants it (``enable_num_token_non_padded()``, i.e. EP > 1),
  ``non_padded`` is a one-element int32 tensor on the draft runner's device
  holding ``tokens``;
* on the DP-attention path: ``unscaled`` (``original_global_num_tokens_cpu``)
  is the raw per-rank request counts, one non-negative int per DP rank;
  ``scaled_cpu`` and ``scaled_logprob_cpu`` are per-rank lists and, unless
  SGLang's DP prefill coordination already scaled them, ``scaled_cpu`` is
  ``unscaled`` x the draft block width; this rank's ``non_padded_cpu`` does
  not exceed its padded count.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

#: The text of stock 0.5.16's crash in ``can_run_graph`` under DP attention.
KNOWN_CRASH = "'NoneType' object is not iterable"


class DeviceValue(NamedTuple):
    """A tensor field as observed: ``value`` is None when it was not read
    (reading a device value synchronises the host with the stream)."""

    dtype: Any
    device: Any
    shape: tuple[int, ...]
    value: Any = None


def observe(forward_batch: Any, names: Any, *, read_device: bool) -> dict[str, Any]:
    """The DP/EP fields of ``forward_batch`` by logical key (``names`` maps
    keys to the installed field names); lists copied, tensors described."""
    import torch

    out: dict[str, Any] = {}
    for f in dataclasses.fields(names):
        name = getattr(names, f.name)
        if name is None:
            continue
        value = getattr(forward_batch, name, None)
        if isinstance(value, torch.Tensor):
            value = DeviceValue(
                value.dtype,
                value.device,
                tuple(value.shape),
                value.detach().cpu().tolist() if read_device else None,
            )
        elif isinstance(value, (list, tuple)):
            value = list(value)
        out[f.name] = value
    return out


@dataclasses.dataclass(frozen=True)
class Expected:
    """What one rank's draft batch must hold (see the module docstring)."""

    tokens: int
    counts: list[int] | None  # raw per-rank counts; None: not the DP path
    width: int
    coordinated: bool  # SGLang's DP prefill coordination scaled them already
    device_count: bool  # SGLang wants the non-padded device count
    dp_size: int
    device: Any
    rank: int | None


def expect(
    *,
    tokens: int,
    counts: list[int] | None,
    width: int,
    device_count: bool,
    device: Any = "cpu",
    coordinated: bool = False,
    dp_size: int | None = None,
    rank: int | None = None,
) -> Expected:
    import torch

    if dp_size is None:
        dp_size = len(counts) if counts is not None else 1
    return Expected(
        tokens=int(tokens),
        counts=None if counts is None else list(counts),
        width=int(width),
        coordinated=bool(coordinated),
        device_count=bool(device_count),
        dp_size=int(dp_size),
        device=torch.device(device),
        rank=rank,
    )


@dataclasses.dataclass(frozen=True)
class Gap:
    """One field that is not what it must be."""

    key: str  # logical key (DraftDPFieldNames attribute)
    want: Any
    got: Any
    why: str

    def render(self, names: Any = None) -> str:
        field = getattr(names, self.key, None) if names is not None else None
        return f"{field or self.key}: {self.why} (got {self.got!r})"


def draft_tokens(count: int, width: int) -> int:
    """Draft tokens of a rank with ``count`` requests."""
    return int(count) * int(width)


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _list_gap(key: str, value: Any, size: int) -> Gap | None:
    if not isinstance(value, list):
        return Gap(key, f"{size} counts", value, "expected a per-rank list")
    if len(value) != size:
        return Gap(key, size, value, f"expected one entry per DP rank ({size})")
    if not all(_is_count(v) for v in value):
        return Gap(key, "counts", value, "entries must be non-negative ints")
    return None


def _same_device(want: Any, got: Any) -> bool:
    if got == want:
        return True
    # "cuda" (no index) accepts any cuda device.
    return getattr(got, "type", None) == want.type and want.index is None


def check(observed: dict[str, Any], exp: Expected) -> list[Gap]:
    """Every gap between ``observed`` (from :func:`observe`) and ``exp``,
    in a fixed order (host count, device count, then the DP lists)."""
    gaps: list[Gap] = []
    cpu = observed.get("non_padded_cpu")
    if not _is_count(cpu):
        gaps.append(
            Gap("non_padded_cpu", exp.tokens, cpu, "expected a non-negative int")
        )
    elif cpu > exp.tokens:
        gaps.append(
            Gap(
                "non_padded_cpu",
                exp.tokens,
                cpu,
                f"exceeds the padded token count {exp.tokens}",
            )
        )
    elif cpu != exp.tokens:
        gaps.append(
            Gap(
                "non_padded_cpu", exp.tokens, cpu, f"expected {exp.tokens} draft tokens"
            )
        )

    if exp.device_count:
        dev = observed.get("non_padded")
        import torch

        if not isinstance(dev, DeviceValue):
            gaps.append(
                Gap("non_padded", exp.tokens, dev, "expected a device int32 scalar")
            )
        elif dev.dtype != torch.int32 or (dev.shape not in ((), (1,))):
            gaps.append(
                Gap(
                    "non_padded",
                    "int32 scalar",
                    (dev.dtype, dev.shape),
                    "expected one int32 element",
                )
            )
        elif not _same_device(exp.device, dev.device):
            gaps.append(
                Gap(
                    "non_padded",
                    exp.device,
                    dev.device,
                    f"expected on the draft runner's device {exp.device}",
                )
            )
        elif dev.value is not None:
            got = dev.value[0] if isinstance(dev.value, list) else dev.value
            if got != exp.tokens:
                gaps.append(
                    Gap("non_padded", exp.tokens, got, f"expected {exp.tokens}")
                )

    if exp.counts is None:
        return gaps
    unscaled = observed.get("unscaled")
    gap = _list_gap("unscaled", unscaled, exp.dp_size)
    if gap is None and unscaled != exp.counts:
        gap = Gap(
            "unscaled",
            exp.counts,
            unscaled,
            f"expected the raw per-rank counts {exp.counts}",
        )
    if gap is not None:
        gaps.append(gap)
    scaled = observed.get("scaled_cpu")
    gap = _list_gap("scaled_cpu", scaled, exp.dp_size)
    if gap is None and not exp.coordinated:
        want = [c * exp.width for c in exp.counts]
        if scaled != want:
            gap = Gap(
                "scaled_cpu",
                want,
                scaled,
                f"expected unscaled x draft block width {exp.width} = {want}",
            )
    if gap is not None:
        gaps.append(gap)
    gap = _list_gap(
        "scaled_logprob_cpu", observed.get("scaled_logprob_cpu"), exp.dp_size
    )
    if gap is not None:
        gaps.append(gap)
    if (
        exp.rank is not None
        and isinstance(scaled, list)
        and 0 <= exp.rank < len(scaled)
        and _is_count(cpu)
        and _is_count(scaled[exp.rank])
        and cpu > scaled[exp.rank]
    ):
        gaps.append(
            Gap(
                "non_padded_cpu",
                scaled[exp.rank],
                cpu,
                f"exceeds this rank's padded count {scaled[exp.rank]}",
            )
        )
    return gaps
