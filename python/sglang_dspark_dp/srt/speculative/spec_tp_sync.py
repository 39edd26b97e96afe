"""The capture-group-memory repair: ``SpecTpSync``'s startup memory reading
is reduced over the group it is passed, as SGLang PR #39954 does.

Counterpart of ``sglang/srt/speculative/spec_tp_sync.py`` (SGLang issue
#39886, fix proposed in PR #39954, in no release yet). From 0.5.19 the DSpark
worker takes its startup free-memory reading, which decides draft CUDA-graph
capture (and on 0.5.19-0.5.21 folded sampling), through
``SpecTpSync.available_memory_gb(site, device, gpu_id, group=<capture
group>)``. The installed method reduces over ``group`` only where the
instance's own sync sites are on, and an instance built on a one-rank group
(the attention-TP group under DP attention with attention TP 1) has none: each
rank then decides from its own memory, and ranks on opposite sides of the
1 GiB cutoff hang in the capture barriers.

The hook is an AROUND hook on ``available_memory_gb`` at the depth of
#39954: where the group passed has more than one rank and the site is one
``SGLANG_SPEC_TP_SYNC`` selects (parsed by SGLang, whatever size of group the
instance was built on), the reading is SGLang's helper, looked up where the
installed module looks it up, with ``distributed=True`` over that group's
CPU group. Every other call is the stock method. ``SGLANG_SPEC_TP_SYNC`` is
honoured as the fixed code honours it: a setting that leaves the site out
gets the rank-local reading, and since that can hang a group of several
ranks, one warning says so.

Why the reduction cannot deadlock: every rank of the capture group reads at
the same point of startup (``init_cuda_graphs``), with the same site and the
same setting; whether it reduces depends on those and the group's size,
never on a rank's own state. Before the first reduction on a group the ranks
agree on the repair (:mod:`sglang_dspark_dp.consensus`). Cost: one small
CPU-group all-reduce per process at startup, as #39954's.

Nothing is decided by version string: :func:`probe` calls the installed
method on a ``SpecTpSync`` built on a one-rank stand-in group, passing a
two-rank one, with a recorder where the module looks up the helper.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import spec_sync as sg_sync
from sglang_dspark_dp.consensus import GroupVerdict
from sglang_dspark_dp.drivers import worker as standins
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.upstream import State, Verdict

logger = logging.getLogger("sglang_dspark_dp")

CHANGE = "capture-group-memory"

#: What the probe's recorder answers (GiB).
_PROBE_GIB = 2.0


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """How ``available_memory_gb`` asked for its reading when its own group
    has one rank and the group passed has two."""

    readings: tuple[standins.MemoryReading, ...]
    passed_cpu_group: Any

    @property
    def reduced(self) -> bool:
        return bool(self.readings) and all(
            r.distributed and r.cpu_group is self.passed_cpu_group
            for r in self.readings
        )

    def describe(self) -> str:
        if not self.readings:
            return "no free-memory reading"
        how = (
            "reduced over the group passed"
            if self.reduced
            else "rank-local (distributed=False)"
        )
        return f"{sg_sync.SYNC}.{sg_sync.READING} read free memory {how}"


class _LocalVerdict:
    """The probe's verdict: nobody to agree with."""

    ok = True

    def agree(self, cpu_group: Any, world_size: int) -> bool:
        return True


@isolated
def probe(module: Any, cls: type, around: Any = None) -> ProbeResult:
    """Call the installed ``available_memory_gb`` (through ``around`` if
    given) on a ``SpecTpSync`` built on a one-rank stand-in group, passing
    a two-rank one, with ``SGLANG_SPEC_TP_SYNC`` at its default."""
    own = standins.ProbeGroup(world_size=1)
    passed = standins.ProbeGroup(world_size=2)
    site = sg_sync.memory_site(module)
    fn = sg_sync.stock_reading(cls)
    recorded = standins.RecordedReadings([module], value=_PROBE_GIB)
    try:
        with sg_sync.every_site():
            sync = cls(own)
            with recorded:
                if around is None:
                    fn(sync, site, "cpu", 0, group=passed)
                else:
                    around(fn, sync, site, "cpu", 0, group=passed)
    except Exception as exc:
        raise DidNotEnable(
            f"could not drive the installed {sg_sync.SYNC}.{sg_sync.READING} on "
            f"CPU stand-ins: {type(exc).__name__}: {exc}"
        ) from exc
    return ProbeResult(tuple(recorded.readings), passed.cpu_group)


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    if result.reduced:
        return (
            Verdict(
                CHANGE,
                State.IN,
                f"{sg_sync.SYNC}.{sg_sync.READING} reduces over the group it is "
                "passed when its own group has one rank",
            ),
        )
    return (
        Verdict(
            CHANGE,
            State.NOT_IN,
            f"{sg_sync.SYNC}.{sg_sync.READING} reads this rank's free memory when "
            "its own group has one rank (DP attention, attention TP 1), though the "
            "draft captures over a group of several",
        ),
    )


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_left_out(site: Any, size: int) -> None:
    name = sg_sync.site_name(site)
    with _warn_lock:
        if name in _warned:
            return
        _warned.add(name)
    logger.warning(
        "sglang-dspark-dp: %s: %s=%r leaves %s out: each of the %d ranks of the "
        "draft capture group reads its own free memory at startup, and startup "
        "can hang when ranks straddle the %.0f GiB draft CUDA-graph cutoff",
        CHANGE,
        sg_sync.SETTING,
        sg_sync.setting_value(),
        name,
        size,
        adapter.CAPTURE_CUTOFF_GIB,
    )


def make_around(module: Any, cls: type, verdict: Any) -> Any:
    """The AROUND hook on ``available_memory_gb``; ``verdict`` says (and
    agrees over the group) whether this rank runs the repair."""
    sig = sg_sync.reading_signature(cls)

    def reduce_over_passed_group(original: Any, sync: Any, *args: Any, **kwargs: Any):
        bound = sig.bind(sync, *args, **kwargs)
        group = bound.arguments["group"]
        size = getattr(group, "world_size", None)
        if not isinstance(size, int) or size <= 1:
            return original(sync, *args, **kwargs)
        site = bound.arguments["site"]
        if site not in sg_sync.configured_sites(module):
            _warn_left_out(site, size)
            return original(sync, *args, **kwargs)
        cpu_group = getattr(group, "cpu_group", None)
        if cpu_group is None or not verdict.agree(cpu_group, size):
            return original(sync, *args, **kwargs)
        return sg_sync.memory_helper(module)(
            bound.arguments["device"],
            bound.arguments["gpu_id"],
            distributed=True,
            cpu_group=cpu_group,
        )

    return reduce_over_passed_group


class CaptureGroupMemoryRepair(Repair):
    """Reduces ``SpecTpSync``'s startup memory reading over the group it is
    passed (the draft capture group), as #39954 does."""

    name = CHANGE
    stands_in_for = (CHANGE,)

    def __init__(self) -> None:
        super().__init__()
        self.probe_result: ProbeResult | None = None

    def _target(self) -> tuple[Any, type] | None:
        try:
            return sg_sync.load_sync()
        except DidNotEnable:
            adapter.load_worker()  # no DSpark at all: not applicable
            return None

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        target = self._target()
        if target is None:  # startup-capture judges #39954 there
            return ()
        return verdicts(probe(*target))

    def setup_once(self) -> Hook | NotNeeded:
        adapter.hook_registry()  # DidNotEnable without SGLang's plugin API
        target = self._target()
        if target is None:
            return NotNeeded(
                f"this release has no {sg_sync.SYNC}: its DSpark worker reads "
                "startup memory itself (startup-capture repairs that); nothing "
                "patched"
            )
        module, cls = target
        stock = probe(module, cls)
        self.probe_result = stock
        self.found(verdicts(stock))
        detail: dict[str, Any] = {
            "target": sg_sync.READING_TARGET,
            "stock": stock.describe(),
        }
        if stock.reduced:
            return NotNeeded(
                f"{stock.describe()}; nothing patched",
                detail,
            )
        check = probe(module, cls, around=make_around(module, cls, _LocalVerdict()))
        if not check.reduced:
            raise DidNotEnable(
                f"the hook did not make the reading reduce ({check.describe()})"
            )
        detail["repaired"] = check.describe()
        return Hook(
            target=sg_sync.READING_TARGET,
            owner=cls,
            attr=sg_sync.READING,
            around=make_around(module, cls, GroupVerdict(self.name, True)),
            reason=(
                f"{sg_sync.SYNC}.{sg_sync.READING} reads this rank's free memory "
                "when its own group has one rank (DP attention, attention TP 1); "
                "reducing it over the capture group it is passed, where "
                f"{sg_sync.SETTING} selects the site"
            ),
            detail=detail,
        )

    def agreement_hook(self, why: str) -> Hook | None:
        target = self._target()
        if target is None:
            return None
        module, cls = target
        return Hook(
            target=sg_sync.READING_TARGET,
            owner=cls,
            attr=sg_sync.READING,
            around=make_around(module, cls, GroupVerdict(self.name, False, why)),
            reason=(
                f"{why}; hooked only to agree with the other ranks of the capture "
                "group, which then all read their own free memory (stock)"
            ),
        )


REPAIR = CaptureGroupMemoryRepair()
