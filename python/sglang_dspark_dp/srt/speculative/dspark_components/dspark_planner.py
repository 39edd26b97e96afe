"""The verify-budget repair: every rank of the verify planner's group uses
the same verify token budget at every scheduled step.

Counterpart of ``sglang/srt/speculative/dspark_components/dspark_planner.py``
(SGLang PR #31195, open, in no release). With a budget-scheduling ragged
verify mode (``SGLANG_RAGGED_VERIFY_MODE=compact`` with a profiled SPS
table, or ``cap-accept``), ``DSparkVerifyPlanner``'s ``_budget_from_resolved``
turns the draft confidences into a verify token budget on each rank alone
(an argmax over confidence x steps-per-second), and ``schedule_layout`` keys
the verify CUDA-graph tier (``graph_num_tokens``) off that local budget.
Confidences a few 1e-3 apart across ranks (their confidence heads round
differently) flip a near-tie, and ranks replay graphs of different token
counts in the same TP collectives. Such drift can come at any step, so the
budget is agreed at every scheduled step.

The other half of the family, a rank whose lagged confidences have not
landed (``ConfidenceRelay.resolve`` answers None there alone, and that rank
skips the ``verify_lens`` broadcast), is the relay-wait repair's: it waits
for the copy, as upstream does. Should that repair not apply, the broadcast
here still carries a None budget (as -1) from the first rank, so the ranks
still agree on whether the broadcast runs.

``verify_lens`` is broadcast from the group's first rank on every release
(0.5.19's ``SpecTpSync`` site ``DSPARK_PLAN`` included), but the budget and
the tier are not. The hook is an AROUND hook on ``_budget_from_resolved``:
after the stock method, one 8-byte broadcast of the budget (None as -1) from
the group's first rank over the group's CPU group, so every rank leaves with
the first rank's budget (an int everywhere, or None everywhere). The group
is the one the ``verify_lens`` broadcast runs on, found where the stock code
finds it (:mod:`sglang_dspark_dp.adapter.planner`). Skipped (the stock
budget returned untouched) where the group has one rank, where the planner
schedules no budget (static mode) and where it verifies all (compact with
a flat SPS table). Nothing else is touched: the budget planner, its carry
ring and the verify-length schedule run as SGLang wrote them.

Why the broadcast cannot deadlock: every rank of the group reaches
``_budget_from_resolved`` at the same point of every decode step (overlap:
``prepare_verify_budget`` from the scheduler, once per decode batch, for
every rank of a TP group that runs the same batch; non-overlap:
``compute_budget_sync`` once per verify with confidences), and whether it
broadcasts depends only on the server's configuration (mode, table, group
size), never on a rank's own state (the budget itself may be None: it is
still sent). Before the first broadcast on a group the ranks agree on the
repair (:mod:`sglang_dspark_dp.consensus`): a rank whose probe failed makes
the whole group run stock. Cost: one int64 broadcast over gloo per decode
step where a budget is scheduled and the group has more than one rank.

Nothing is decided by version string. :func:`probe` builds the installed
planner on CPU with a profiled SPS table and a two-rank group stand-in that
replays the first rank's broadcasts to the second, and looks at what the
installed code does with two ranks whose confidences differ: do their graph
tiers differ with no collective in between? Already agreeing (a later
release): nothing is patched. Then the same probe runs through the hook to
check that it makes the ranks agree.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import planner as sg_planner
from sglang_dspark_dp.consensus import GroupVerdict
from sglang_dspark_dp.drivers import planner as standins
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.upstream import State, Verdict

logger = logging.getLogger("sglang_dspark_dp")

CHANGE = "verify-budget-broadcast"

#: The value a budget of None travels as.
NO_BUDGET = -1

# The probe: two requests of gamma 3 (4 verify tokens each), graphs captured
# at 2/4/6/8 tokens, and an SPS table whose step rate halves from 3 batch
# tokens on. Confident drafts then choose the whole window (budget 6, tier
# 8); unconfident ones choose none (budget 0, tier 2).
PROBE_BS = 2
PROBE_GAMMA = 3
PROBE_VERIFY_TOKENS = PROBE_GAMMA + 1
PROBE_CAPTURE = (2, 4, 6, 8)
PROBE_SPS = ((1, 1.0), (3, 0.5))
PROBE_POOL = 8
PROBE_HIGH = 0.99
PROBE_LOW = 0.05


def _tensor(value: int):
    import torch

    return torch.tensor([value], dtype=torch.int64)


def to_wire(budget: int | None) -> int:
    return NO_BUDGET if budget is None else int(budget)


def from_wire(value: int) -> int | None:
    return None if value < 0 else int(value)


_SOURCES: dict[int, int] = {}


def broadcast_budget(group: Any, budget: int | None) -> int | None:
    """The group's first rank's budget, on every rank of ``group`` (one
    int64 broadcast over its ``cpu_group``)."""
    import torch.distributed as dist

    cpu_group = group.cpu_group
    src = _SOURCES.get(id(cpu_group))
    if src is None:
        src = _SOURCES[id(cpu_group)] = dist.get_global_rank(cpu_group, 0)
    t = _tensor(to_wire(budget))
    dist.broadcast(t, src=src, group=cpu_group)
    return from_wire(int(t.item()))


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What two simulated ranks of the installed planner chose."""

    shape: str
    #: Tier step: the source (rank 0, confident drafts) and the other rank
    #: (unconfident drafts): each one's budget and graph tier.
    budgets: tuple[int | None, int | None]
    tiers: tuple[int | None, int | None]
    #: The tier the unconfident drafts get on the source rank alone (what
    #: the other rank's own inputs choose).
    own_tier: int | None

    @property
    def tier_local(self) -> bool:
        """The two ranks' graph tiers differ: each picked its own."""
        return self.tiers[0] != self.tiers[1]

    @property
    def agrees(self) -> bool:
        return not self.tier_local

    def describe(self) -> str:
        if self.tier_local:
            return (
                f"graph tiers {self.tiers[0]} vs {self.tiers[1]} tokens from budgets "
                f"{self.budgets[0]} vs {self.budgets[1]}"
            )
        return f"both ranks on graph tier {self.tiers[0]} (budget {self.budgets[0]})"


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    if result.tier_local:
        return (
            Verdict(
                CHANGE,
                State.NOT_IN,
                "two ranks whose draft confidences differ pick compact-verify "
                f"{result.describe()}, with no collective in between",
            ),
        )
    return (Verdict(CHANGE, State.IN, result.describe()),)


def _replay_exchange(group: Any, budget: int | None) -> int | None:
    return from_wire(group.exchange(to_wire(budget)))


def _rows():
    import torch

    return torch.arange(1, PROBE_BS + 1, dtype=torch.int64)


def _confidence(level: float):
    import torch

    return torch.full((PROBE_BS, PROBE_GAMMA), float(level), dtype=torch.float32)


def _build(module: Any, cls: type, group: Any, rt: Any) -> Any:
    runner = standins.model_runner(
        req_pool_size=PROBE_POOL,
        capture_num_tokens=list(PROBE_CAPTURE),
        max_bs=PROBE_BS * 2,
    )
    runner.req_to_token_pool.req_generation[_rows()] = 1
    # Built as a rank other than the first, so that neither the planner nor
    # its SpecTpSync logs its start-up lines from the probe.
    group.rank_in_group = 1
    try:
        return sg_planner.build_planner(
            module,
            cls,
            draft_model=standins.draft_model(),
            model_runner=runner,
            runtime=rt,
            group=group,
            gamma=PROBE_GAMMA,
            verify_num_draft_tokens=PROBE_VERIFY_TOKENS,
            tp_rank=1,
        )
    finally:
        group.rank_in_group = 0


def _tier(layout: Any) -> int | None:
    return None if layout is None else int(layout.graph_num_tokens)


def _step(planner: Any, level: float, *, calls: int) -> tuple[Any, Any]:
    """One scheduled verify on ``planner``: its budget (the last of
    ``calls`` budget calls on confidences at ``level``) and its layout."""
    import torch

    rows = _rows()
    confidence = _confidence(level)
    budget = None
    for _ in range(calls):
        budget = planner.compute_budget_sync(
            confidence=confidence,
            prefix_lens=torch.full((PROBE_BS,), 16, dtype=torch.int64),
            req_pool_indices=rows,
        )
    layout = planner.schedule_layout(
        req_pool_indices=rows,
        prefix_lens=torch.full((PROBE_BS,), 16, dtype=torch.int64),
        device=torch.device("cpu"),
        confidence=confidence,
        budget=budget,
    )
    return budget, layout


@isolated
def probe(module: Any, cls: type, around: Any = None) -> ProbeResult:
    """Run the installed planner (``_budget_from_resolved`` as SGLang wrote
    it, through ``around`` if given) as two simulated ranks on CPU, whose
    draft confidences differ.
    Raises DidNotEnable where the installed code has no known broadcast
    group; anything else that goes wrong propagates (a failure that need
    not be the same on every rank)."""
    shape = sg_planner.group_shape(module)
    if shape is None:
        raise DidNotEnable(
            f"{sg_planner.PLANNER_MODULE} has neither {sg_planner.GROUP_FUNCTION} "
            f"nor {sg_planner.TP_SYNC_CLASS}: the verify_lens broadcast group is "
            "not one this repair can find"
        )
    original = sg_planner.stock_budget(cls)
    if around is None:
        fn = original
    else:

        def fn(planner: Any, **kwargs: Any) -> Any:
            return around(original, planner, **kwargs)

    group = standins.ReplayGroup(world_size=2)
    table = sg_planner.profiled_sps_table(
        list(PROBE_SPS), max_batch_tokens=PROBE_BS * PROBE_VERIFY_TOKENS
    )
    rt = standins.runtime(
        tp_size=2, disable_overlap_schedule=False, sps_table_path="<probe>"
    )
    swaps = sg_planner.runtime_swaps(
        module, runtime=rt, group=group, mode=sg_planner.COMPACT, sps_table=table
    )
    with swaps:
        source, other, alone = (_build(module, cls, group, rt) for _ in range(3))
        with (
            sg_planner.bind_budget(source, fn),
            sg_planner.bind_budget(other, fn),
            sg_planner.bind_budget(alone, fn),
        ):
            # Enough budget calls to fill the budget planner's carry ring
            # (its lag behind the relay), the same number on both ranks.
            warm = int(source.lag_steps or 0) + 1
            group.act_as(0)
            b0, l0 = _step(source, PROBE_HIGH, calls=warm)
            group.act_as(1)
            b1, l1 = _step(other, PROBE_LOW, calls=warm)
            group.act_as(0)
            _, own = _step(alone, PROBE_LOW, calls=warm)
    result = ProbeResult(
        shape=shape,
        budgets=(b0, b1),
        tiers=(_tier(l0), _tier(l1)),
        own_tier=_tier(own),
    )
    if result.tiers[0] is None or result.own_tier is None:
        raise RuntimeError(
            f"the probe's planner produced no compact layout ({result.describe()})"
        )
    if result.own_tier == result.tiers[0]:
        raise RuntimeError(
            "the probe's confident and unconfident drafts chose the same graph "
            f"tier ({result.own_tier} tokens): it cannot tell rank-local tiers "
            "from agreed ones"
        )
    return result


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(why: str) -> None:
    with _warn_lock:
        if why in _warned:
            return
        _warned.add(why)
    logger.warning(
        "sglang-dspark-dp: verify-budget: %s; each rank keeps its own verify "
        "budget (stock behaviour)",
        why,
    )


def make_around(
    module: Any, shape: str, verdict: Any, exchange: Any = broadcast_budget
) -> Any:
    """The AROUND hook on ``_budget_from_resolved``: the stock budget, then
    the group's first rank's, where the group has more than one rank and
    the planner schedules a budget. ``verdict`` says (and agrees over the
    group) whether this rank runs the repair; ``exchange(group, budget)``
    moves the budget (a real broadcast, or the probe's replay)."""

    def agree_verify_budget(original: Any, planner: Any, *args: Any, **kwargs: Any):
        budget = original(planner, *args, **kwargs)
        if not sg_planner.schedules_budget(planner):
            return budget
        try:
            group = sg_planner.broadcast_group(planner, module, shape)
        except Exception as exc:  # the stock broadcast would fail the same way
            _warn_once(f"cannot find the verify_lens broadcast group ({exc})")
            return budget
        size = getattr(group, "world_size", None)
        if not isinstance(size, int):
            _warn_once(
                f"the verify_lens broadcast group was not found "
                f"({sg_planner.SHAPE_WHERE[shape]} gave {group!r})"
            )
            return budget
        if size <= 1:
            return budget
        cpu_group = getattr(group, "cpu_group", None)
        if cpu_group is None:
            _warn_once("the verify_lens broadcast group has no CPU group")
            return budget
        if not verdict.agree(cpu_group, size):
            return budget
        agreed = exchange(group, budget)
        if agreed is None and budget is not None:
            sg_planner.note_no_budget(planner)
        return agreed

    return agree_verify_budget


class VerifyBudgetRepair(Repair):
    """Broadcasts DSpark's per-step verify budget from the first rank of
    the ``verify_lens`` broadcast group, so its ranks pick one graph tier
    and all enter that broadcast."""

    name = "verify-budget"
    stands_in_for = (CHANGE,)

    def __init__(self) -> None:
        super().__init__()
        self.probe_result: ProbeResult | None = None
        self.shape: str | None = None

    def _target(self) -> tuple[Any, type, str]:
        module, cls = sg_planner.load_planner()
        adapter.hook_registry()  # DidNotEnable without SGLang's plugin API
        shape = sg_planner.group_shape(module)
        if shape is None:
            raise DidNotEnable(
                f"{sg_planner.PLANNER_MODULE} has neither "
                f"{sg_planner.GROUP_FUNCTION} nor {sg_planner.TP_SYNC_CLASS}: the "
                "verify_lens broadcast group is not one this repair can find"
            )
        return module, cls, shape

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        module, cls, _shape = self._target()
        return verdicts(probe(module, cls))

    def setup_once(self) -> Hook | NotNeeded:
        module, cls, shape = self._target()
        stock = probe(module, cls)
        self.probe_result = stock
        self.found(verdicts(stock))
        detail: dict[str, Any] = {
            "target": sg_planner.BUDGET_TARGET,
            "group": sg_planner.SHAPE_WHERE[shape],
            "stock": stock.describe(),
        }
        if stock.agrees:
            return NotNeeded(
                "the DSpark verify planner already agrees its verify budget across "
                f"the verify_lens broadcast group ({stock.describe()}); nothing "
                "patched",
                detail,
            )
        check = probe(
            module,
            cls,
            around=make_around(
                module, shape, GroupVerdict(self.name, True), _replay_exchange
            ),
        )
        if not check.agrees:
            raise DidNotEnable(
                "broadcasting the verify budget did not make the probe's ranks "
                f"agree ({check.describe()})"
            )
        self.shape = shape
        detail["shape"] = shape
        detail["repaired"] = check.describe()
        return Hook(
            target=sg_planner.BUDGET_TARGET,
            owner=cls,
            attr=sg_planner.BUDGET,
            around=make_around(module, shape, GroupVerdict(self.name, True)),
            reason=(
                "ranks pick the compact verify graph tier from their own budget "
                f"(probe: {stock.tiers[0]} vs {stock.tiers[1]} tokens); broadcasting "
                "the verify budget from the first rank of "
                f"{sg_planner.SHAPE_WHERE[shape]} at every scheduled step"
            ),
            detail=detail,
        )

    def agreement_hook(self, why: str) -> Hook | None:
        module, cls, shape = self._target()  # DidNotEnable: no target anywhere
        return Hook(
            target=sg_planner.BUDGET_TARGET,
            owner=cls,
            attr=sg_planner.BUDGET,
            around=make_around(module, shape, GroupVerdict(self.name, False, why)),
            reason=(
                f"{why}; hooked only to agree with the other ranks of the "
                "verify_lens broadcast group, which then all keep their own "
                "verify budget (stock)"
            ),
        )


REPAIR = VerifyBudgetRepair()
