"""The draft-batch repair: its probe, its plan and its hook.

Counterpart of ``sglang/srt/speculative/dspark_components/dspark_draft.py``.
``DraftBlockProposer`` builds its draft ``ForwardBatch`` by hand (busy ranks
in ``_run_forward``, idle ranks in ``run_idle_participation``) and hands it
to ``_fill_dp_moe_sync_metadata`` for the DP/EP fields; that fill is the
hook target.

Nothing is decided by version string: :func:`probe` runs the installed stock
fill on a tiny CPU batch (EP forced to 2 through SGLang's own
``get_parallel().override``), on the DP-attention path and on the
attention-TP path, and asks :mod:`sglang_dspark_dp.expectations` which
fields come back wrong. It also watches the stock DP fill's tensor factory
calls (a ``TorchFunctionMode``): one that builds a tensor on the draft
runner's device straight from host data (``torch.tensor(x, device=...)``) is
a synchronous copy from pageable memory, ordered after all queued GPU work,
so on a GPU the host waits for the stream at every draft step. Where the
stock DP fill is broken, or correct but blocking, and sets nothing the
plugin does not derive, the plugin's fill replaces it whole (same values, a
pinned non-blocking copy into persistent buffers). Where nothing is wrong,
nothing is patched.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from sglang_dspark_dp import adapter, expectations
from sglang_dspark_dp.adapter import FILL, TARGET, SGLangAPI
from sglang_dspark_dp.drivers.builders import (
    DeviceOnlyRunner,
    build_draft_proposer,
    make_schedule_batch,
)
from sglang_dspark_dp.drivers.draft import DraftDriver
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
    ALL_GROUPS,
    NON_PADDED,
    SCALED,
    UNSCALED,
    DraftDPBuffers,
    DraftDPFieldNames,
    derive_draft_dp_metadata,
)
from sglang_dspark_dp.srt.speculative.dspark_dp_guard import (
    check_draft_batch,
    guard_enabled,
)
from sglang_dspark_dp.upstream import State, Verdict

_BUFFERS_ATTR = "_sglang_dspark_dp_buffers"

#: The upstream changes this repair stands in for.
DP_METADATA = "dp-draft-metadata"
TP_NON_PADDED = "tp-draft-non-padded"
NO_HOST_WAIT = "dp-fill-no-host-wait"

#: Which field group repairs each logical key.
_GROUP_OF = {
    "unscaled": UNSCALED,
    "non_padded": NON_PADDED,
    "non_padded_cpu": NON_PADDED,
    "scaled_cpu": SCALED,
    "scaled_logprob_cpu": SCALED,
}


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What the installed stock fill leaves wrong, per path."""

    names: DraftDPFieldNames
    missing_dp: tuple[str, ...]  # ForwardBatch fields, DP-attention path
    missing_local: tuple[str, ...]  # ForwardBatch fields, attention-TP path
    replaceable: bool  # the stock DP fill sets nothing beyond what we derive
    foreign_fields: tuple[str, ...]  # fields the stock DP fill sets besides ours
    gaps_dp: tuple[expectations.Gap, ...] = ()
    gaps_local: tuple[expectations.Gap, ...] = ()
    #: The stock DP fill's calls that would make the host wait for the GPU.
    blocking: tuple[str, ...] = ()
    #: The stock DP fill passes counts through where SGLang's DP prefill
    #: coordination already scaled them (it reads that flag).
    honours_coordination: bool = False

    @property
    def affected(self) -> bool:
        return bool(self.missing_dp or self.missing_local)

    @staticmethod
    def groups_of(gaps: tuple[expectations.Gap, ...]) -> frozenset[str]:
        return frozenset(_GROUP_OF[g.key] for g in gaps if g.key in _GROUP_OF)


def _all_fields(fb: Any) -> dict[str, Any]:
    return {f.name: getattr(fb, f.name) for f in dataclasses.fields(fb)}


class _FactoryCalls(TorchFunctionMode):
    """Records tensor factories that copy host data straight to a device."""

    def __init__(self) -> None:
        super().__init__()
        self.blocking: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device"):
            self.blocking.append(
                f"torch.{func.__name__}(<host data>, device=...) "
                "(a synchronous copy from pageable memory)"
            )
        return func(*args, **kwargs)


def _stock_dp_fill(api: SGLangAPI, names: DraftDPFieldNames, fb: Any, counts):
    """Run the stock DP fill once more on ``fb``; return the fields it sets
    that :func:`derive_draft_dp_metadata` does not (then it cannot be
    replaced whole), its calls that would block a GPU host, and whether it
    passes the counts through unscaled where SGLang's DP prefill
    coordination says they are scaled already."""
    for key in ("unscaled", "non_padded", "non_padded_cpu"):
        setattr(fb, getattr(names, key), None)
    proposer = build_draft_proposer(
        api, draft_model_runner=DeviceOnlyRunner("cpu"), gamma=2, dp_moe_sync=True
    )

    def batch(coordinated: bool) -> Any:
        out = make_schedule_batch(
            api,
            seq_lens=torch.full((2,), 8, dtype=torch.int64),
            global_num_tokens=list(counts),
        )
        out.dp_spec_prefill_coordination_applied = coordinated
        return out

    before = _all_fields(fb)
    calls = _FactoryCalls()
    with calls:
        adapter.stock_fill(api)(proposer, fb, batch(False))
    after = _all_fields(fb)
    ours = {getattr(names, f.name) for f in dataclasses.fields(names)}
    foreign = tuple(
        sorted(k for k in after if k not in ours and after[k] is not before[k])
    )
    adapter.stock_fill(api)(proposer, fb, batch(True))
    passes_through = list(getattr(fb, names.scaled_cpu) or ()) == list(counts)
    return foreign, tuple(dict.fromkeys(calls.blocking)), passes_through


@isolated
def probe(api: SGLangAPI | None = None) -> ProbeResult:
    """Build draft batches with the installed stock builder; report the gaps.

    The real ``DraftBlockProposer`` builds a tiny CPU batch on the busy path
    (and, under DP attention, the idle path) with EP forced to 2, for a DP
    attention topology (2 DP ranks) and an attention-TP one (1 DP rank,
    attention TP 2). Raises DidNotEnable if the installed classes cannot even
    be driven that way (renamed fields, unexpected signatures).
    """
    api = api or adapter.load_sglang_api()
    names = DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)
    absent = names.missing("unscaled", "non_padded", "non_padded_cpu")
    if absent:
        raise DidNotEnable(
            f"ForwardBatch declares no {', '.join(absent)} field (renamed?)"
        )
    gaps: dict[bool, list[expectations.Gap]] = {True: [], False: []}
    foreign: tuple[str, ...] = ()
    blocking: tuple[str, ...] = ()
    coordination = False
    try:
        for dp in (True, False):
            topology = (
                dict(dp_size=2, attn_tp_size=1)
                if dp
                else dict(dp_size=1, attn_tp_size=2)
            )
            with adapter.parallel_override(api.get_parallel, ep_size=2, **topology):
                driver = DraftDriver(api, gamma=2, dp_moe_sync=dp, names=names)
                counts = [2, 0] if dp else [2]
                wants_device = api.enable_num_token_non_padded()

                def want(
                    tokens,
                    *,
                    dp=dp,
                    counts=counts,
                    width=driver.width,
                    dev=wants_device,
                ):
                    return expectations.expect(
                        tokens=tokens,
                        counts=counts if dp else None,
                        width=width,
                        device_count=dev,
                    )

                busy = driver.step(2, counts)
                gaps[dp] += expectations.check(busy.fields, want(2 * driver.width))
                if dp:
                    idle = driver.step(0, counts)
                    if idle is not None:
                        gaps[dp] += expectations.check(idle.fields, want(0))
                    foreign, blocking, coordination = _stock_dp_fill(
                        api, names, busy.forward_batch, counts
                    )
    except DidNotEnable:
        raise
    except Exception as exc:  # the installed code could not be driven
        raise DidNotEnable(
            f"probing the stock DSpark draft batch failed: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    scaled_present = not names.missing(
        "scaled_cpu",
        "scaled_gpu",
        "scaled_logprob_cpu",
        "scaled_logprob_gpu",
        "dp_graph_ok",
    )

    def fields(found: list[expectations.Gap]) -> tuple[str, ...]:
        return tuple(dict.fromkeys(getattr(names, g.key) for g in found))

    return ProbeResult(
        names=names,
        missing_dp=fields(gaps[True]),
        missing_local=fields(gaps[False]),
        replaceable=scaled_present and not foreign,
        foreign_fields=foreign,
        gaps_dp=tuple(gaps[True]),
        gaps_local=tuple(gaps[False]),
        blocking=blocking,
        honours_coordination=coordination,
    )


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    """What the probe found of #33098, the attention-TP non-padded counts
    and the DP fill without a host wait."""

    def fields(missing: tuple[str, ...]) -> str:
        return ", ".join(missing)

    out = [
        Verdict(
            DP_METADATA,
            State.NOT_IN,
            f"the DP-attention draft batch misses {fields(result.missing_dp)}",
        )
        if result.missing_dp
        else Verdict(
            DP_METADATA, State.IN, "the DP-attention draft batch carries its metadata"
        ),
        Verdict(
            TP_NON_PADDED,
            State.NOT_IN,
            f"the attention-TP draft batch misses {fields(result.missing_local)}",
        )
        if result.missing_local
        else Verdict(
            TP_NON_PADDED,
            State.IN,
            "the attention-TP draft batch carries its non-padded counts",
        ),
    ]
    if result.blocking:
        out.append(
            Verdict(
                NO_HOST_WAIT,
                State.NOT_IN,
                f"the DP fill calls {result.blocking[0]} at every step: the host "
                "waits for the GPU",
            )
        )
    elif "non_padded" in {g.key for g in result.gaps_dp}:
        out.append(
            Verdict(
                NO_HOST_WAIT,
                State.NOT_AFFECTED,
                "the DP fill has no device non-padded count, so no host-to-device "
                "tensor to wait for",
            )
        )
    else:
        out.append(
            Verdict(
                NO_HOST_WAIT,
                State.IN,
                "the DP fill writes its device counts without a host wait",
            )
        )
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class RepairPlan:
    """What the hook does on each path, fixed at instrument time."""

    dp_groups: frozenset[str]
    dp_calls_stock: bool
    local_groups: frozenset[str]
    guard: bool
    honours_coordination: bool = False

    @classmethod
    def from_probe(cls, result: ProbeResult, *, guard: bool) -> RepairPlan:
        dp_groups = result.groups_of(result.gaps_dp)
        dp_calls_stock = True
        if (dp_groups or result.blocking) and result.replaceable:
            # The stock fill is broken, or blocks the host, and sets nothing
            # we do not derive: replace it whole, so the step pays for one
            # fill, not two, never waits for the GPU, and allocates nothing.
            dp_groups, dp_calls_stock = ALL_GROUPS, False
        return cls(
            dp_groups=dp_groups,
            dp_calls_stock=dp_calls_stock,
            local_groups=result.groups_of(result.gaps_local),
            guard=guard,
            honours_coordination=result.honours_coordination,
        )

    @property
    def patches(self) -> bool:
        return bool(self.dp_groups or self.local_groups or self.guard)

    def describe(self) -> str:
        def fmt(groups: frozenset[str]) -> str:
            return "+".join(sorted(groups)) or "untouched"

        dp = fmt(self.dp_groups)
        if self.dp_groups and not self.dp_calls_stock:
            dp = "replaced (" + dp + ")"
        return f"DP-attention path: {dp}; attention-TP path: {fmt(self.local_groups)}"


def proposer_buffers(proposer: Any) -> DraftDPBuffers:
    """The proposer's persistent buffers on its draft runner's device (read
    where the stock fill reads it), made on its first step and remade only
    if that device changes."""
    device = proposer.draft_model_runner.device
    held = proposer.__dict__.get(_BUFFERS_ATTR)
    if held is not None and (held[0] is device or held[0] == device):
        return held[1]
    buffers = DraftDPBuffers(device)
    proposer.__dict__[_BUFFERS_ATTR] = (device, buffers)
    return buffers


def held_buffers(proposer: Any) -> DraftDPBuffers | None:
    """The buffers the repaired fill made for ``proposer`` (None: none yet,
    or the fill that ran was stock's)."""
    held = proposer.__dict__.get(_BUFFERS_ATTR)
    return None if held is None else held[1]


def make_fill_hook(plan: RepairPlan, names: DraftDPFieldNames, api: SGLangAPI):
    """The AROUND hook for ``DraftBlockProposer._fill_dp_moe_sync_metadata``.

    Every input is read where the stock fill reads it: the DP switch and the
    draft block's spec info on the proposer, the device on its draft runner,
    the counts and the graph flag on the schedule batch, and SGLang's
    ``enable_num_token_non_padded``/``spec_scale_global_num_tokens`` through
    the draft module's names, looked up per call (so a ``mock.patch`` there
    reaches the repair)."""
    dp_groups, local_groups = plan.dp_groups, plan.local_groups
    replaces_dp, guard = not plan.dp_calls_stock, plan.guard
    coordination = plan.honours_coordination
    scale, device_count = api.scale, api.enable_num_token_non_padded
    is_dp, spec_info = adapter.dp_moe_sync, adapter.draft_spec_info

    def dspark_dp_fill(original, proposer, forward_batch, batch):
        dp = is_dp(proposer) and batch.global_num_tokens is not None
        if dp and replaces_dp:
            groups = dp_groups
        else:
            original(proposer, forward_batch, batch)
            groups = dp_groups if dp else local_groups
        if groups:
            derive_draft_dp_metadata(
                forward_batch,
                batch,
                spec_info=spec_info(proposer) if dp else None,
                dp_moe_sync=dp,
                buffers=proposer_buffers(proposer),
                groups=groups,
                names=names,
                scale=scale,
                device_count=NON_PADDED in groups and device_count(),
                honours_coordination=coordination,
            )
        if guard:
            check_draft_batch(proposer, forward_batch, batch, names=names, api=api)

    return dspark_dp_fill


class DraftBatchRepair(Repair):
    """Completes the DP/EP metadata of DSpark's hand-built draft batch."""

    name = "draft-batch"
    stands_in_for = (DP_METADATA, TP_NON_PADDED, NO_HOST_WAIT)

    def __init__(self) -> None:
        super().__init__()
        self.plan: RepairPlan | None = None
        self.probe_result: ProbeResult | None = None
        self._guard: bool | None = None

    def instrument(self, *, apply: bool = True, guard: bool | None = None):
        """As :meth:`Repair.instrument`; ``guard`` overrides the env var."""
        if not self.instrumented:
            self._guard = guard
        return super().instrument(apply=apply)

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        return verdicts(probe())

    def setup_once(self) -> Hook | NotNeeded:
        adapter.hook_registry()  # DidNotEnable without SGLang's plugin API
        api = adapter.load_sglang_api()
        result = probe(api)
        self.found(verdicts(result))
        guard = guard_enabled() if self._guard is None else self._guard
        plan = RepairPlan.from_probe(result, guard=guard)
        self.probe_result, self.plan = result, plan
        missing = sorted(set(result.missing_dp) | set(result.missing_local))
        detail = {
            "stock_dp_fill_blocks": list(result.blocking),
            "missing_fields": {
                "dp_attention_path": list(result.missing_dp),
                "attention_tp_path": list(result.missing_local),
            },
            "repair": plan.describe(),
            "guard": plan.guard,
        }
        if not plan.patches:
            return NotNeeded(
                "the DSpark draft batch already carries its DP/EP metadata and "
                "its DP fill does not wait on the GPU; nothing patched",
                detail,
            )
        return Hook(
            target=TARGET,
            owner=api.proposer_cls,
            attr=FILL,
            around=make_fill_hook(plan, result.names, api),
            offers=api.draft_module_offers(),
            reason=(
                f"repairing the DSpark draft batch (missing: "
                f"{', '.join(missing) or 'none'}; stock DP fill "
                f"{'blocks the host' if result.blocking else 'does not block'}; "
                f"{plan.describe()}; guard {'on' if plan.guard else 'off'})"
            ),
            detail=detail,
        )


REPAIR = DraftBatchRepair()
