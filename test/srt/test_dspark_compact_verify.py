"""The verify-budget repair (SGLang PR #31195): every TP rank of DSpark's
verify planner uses one verify budget, so all pick one compact verify graph
tier and all enter the ``verify_lens`` broadcast.

The gloo runs drive the installed ``DSparkVerifyPlanner`` in one process
per rank (:mod:`sglang_dspark_dp.harness.compact_verify`), as two TP groups
side by side (ranks ``[0, 1]`` and ``[2, 3]``, SGLang's own
``GroupCoordinator`` on gloo): confidence drift
on the non-overlap path, a late confidence relay on the overlap path (with
both verify repairs, and with the budget broadcast alone, which still
carries a late rank's missing budget). The other tests drive the probe and
the hook in this process.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
from known_releases import known
from srt_helpers import enabled_or_skip, no_children_left, restored

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import planner as sg_planner
from sglang_dspark_dp.consensus import GroupVerdict
from sglang_dspark_dp.drivers import planner as standins
from sglang_dspark_dp.harness import compact_verify as cv
from sglang_dspark_dp.outcome import Outcome
from sglang_dspark_dp.registry import NotNeeded
from sglang_dspark_dp.srt.speculative.dspark_components import dspark_planner

REPAIR = dspark_planner.REPAIR

STEPS = 24
HANG_S = 2.0


@pytest.fixture(scope="module")
def planner_cls():
    return sg_planner.load_planner()


@pytest.fixture
def restore_repair():
    """Leave the repair as the test found it."""
    with restored(REPAIR) as repair:
        yield repair


def run(**kwargs) -> cv.CompactResult:
    kwargs.setdefault("steps", STEPS)
    result = cv.run_compact_verify(cv.CompactConfig(hang_s=HANG_S, **kwargs))
    assert no_children_left()
    assert result.complete, result.errors
    return result


def stock_is_wrong(version: str) -> bool:
    """Whether the release is recorded (known_releases, measured with the
    probe and this harness) to pick the verify graph tier per rank."""
    row = known(version)
    if row is None:
        pytest.skip(f"stock behaviour of sglang {version} is not recorded")
    return row["compact_verify"]


#: Two TP groups of two: the second group's first rank is global rank 2.
GROUPS = 2


@pytest.fixture(scope="module")
def drift_runs(planner_cls):
    return {
        fix: run(scenario=cv.DRIFT, fix=fix, groups=GROUPS) for fix in (False, True)
    }


@pytest.fixture(scope="module")
def late_runs(planner_cls):
    return {fix: run(scenario=cv.LATE, fix=fix, groups=GROUPS) for fix in (False, True)}


def test_the_runs_are_two_groups_on_sglangs_group_coordinator(drift_runs):
    for result in drift_runs.values():
        assert result.group_kind == "GroupCoordinator"
        assert {s.ranks for s in result.steps} == {(0, 1), (2, 3)}


# --------------------------------------------------------------------------
# Budget drift: near-tie confidences, a few 1e-3 apart per rank.
# --------------------------------------------------------------------------


def test_stock_ranks_pick_different_tiers_under_drift(drift_runs, sglang_version):
    if not stock_is_wrong(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries #31195")
    result = drift_runs[False]
    assert {r["outcome"] for r in result.repairs} == {Outcome.NOT_INSTRUMENTED.value}
    assert result.diverged, result.summary()
    first = result.diverged[0]
    assert first.budgets[0] != first.budgets[1]
    assert "graph tiers diverged at" in result.summary()
    # Every rank still entered the verify_lens broadcast: it is the tier
    # (and the budget behind it) that stock leaves rank-local.
    assert not result.left_out


def test_repaired_ranks_share_one_tier_under_drift(drift_runs):
    result = drift_runs[True]
    assert {r["outcome"] for r in result.repairs} == {Outcome.ENABLED.value}
    assert result.agree, result.summary()
    assert all(s.broadcast == cv.ALL_IN for s in result.steps)
    assert all(len(set(s.budgets)) == 1 for s in result.steps)
    used = {t for s in result.steps for t in s.tiers}
    assert len(used) > 1  # the tier does move from step to step


def test_the_first_rank_keeps_its_own_budget(drift_runs):
    """The repair never changes the source rank's budget or tier (each
    group's first rank: global ranks 0 and 2); the others take it."""
    stock, fixed = drift_runs[False], drift_runs[True]
    assert [s.budgets[0] for s in fixed.steps] == [s.budgets[0] for s in stock.steps]
    assert [s.tiers[0] for s in fixed.steps] == [s.tiers[0] for s in stock.steps]
    second = [s for s in fixed.steps if s.ranks == (2, 3)]
    assert second and any(
        s.budgets[0] != t.budgets[0]
        for s, t in zip(second, fixed.steps[: len(second)], strict=True)
    ), "the two groups saw the same confidences: nothing tells their sources apart"


# --------------------------------------------------------------------------
# Late relay: a rank's lagged confidences have not landed.
# --------------------------------------------------------------------------


def test_stock_leaves_a_late_rank_out_of_the_broadcast(late_runs, sglang_version):
    if not stock_is_wrong(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries #31195")
    result = late_runs[False]
    late = [s.step for s in result.late_steps]
    assert late, "the run had no late step"
    assert [s.step for s in result.left_out] == late
    for s in result.left_out:
        assert s.in_broadcast == (True, False)
        assert s.budgets[1] is None and s.budgets[0] is not None
    assert f"{len(late)} of {len(late)} late steps" in result.summary()


def test_repaired_late_rank_enters_the_broadcast(late_runs):
    result = late_runs[True]
    assert result.agree, result.summary()
    assert not result.left_out
    for s in result.late_steps:
        assert s.broadcast == cv.ALL_IN
        assert s.budgets[0] == s.budgets[1] is not None


def test_budget_broadcast_alone_carries_a_late_rank(planner_cls):
    """Without the relay's wait, the budget broadcast still brings a late
    rank the first rank's budget: every rank enters verify_lens."""
    result = run(scenario=cv.LATE, fix=True, repairs=("verify-budget",))
    assert result.agree, result.summary()
    assert result.late_steps
    for s in result.late_steps:
        assert s.broadcast == cv.ALL_IN
        assert s.budgets[0] == s.budgets[1] is not None


def test_repaired_late_source_leaves_every_rank_without_a_budget(planner_cls):
    """The first rank late (and no relay wait): its None reaches every
    rank, none broadcasts verify_lens, all take the uniform layout
    together."""
    result = run(scenario=cv.LATE, fix=True, late_rank=0, repairs=("verify-budget",))
    assert result.agree, result.summary()
    assert result.late_steps
    for s in result.late_steps:
        assert s.broadcast == cv.NONE_IN
        assert s.budgets == (None, None)


def test_cap_accept_mode_late_relay(planner_cls, sglang_version):
    """cap-accept also schedules a budget and broadcasts verify_lens: a
    late relay leaves a rank out there too, and the repair covers it."""
    if not stock_is_wrong(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries #31195")
    stock = run(scenario=cv.LATE, fix=False, mode="cap-accept", steps=16)
    assert stock.left_out and len(stock.left_out) == len(stock.late_steps)
    fixed = run(scenario=cv.LATE, fix=True, mode="cap-accept", steps=16)
    assert fixed.agree, fixed.summary()


def test_a_rank_whose_probe_fails_brings_its_group_to_stock_not_to_a_hang(
    late_runs,
):
    """The repair adds a collective; rank 3's probe fails (an unexpected
    exception) while the others' succeed. The ranks of its group [2, 3]
    agree before the first broadcast: both run stock, neither waits in a
    broadcast the other never enters; the group [0, 1] is repaired."""
    result = run(
        scenario=cv.LATE,
        fix=True,
        groups=GROUPS,
        probe_fails=(3,),
        repairs=("verify-budget",),
    )
    assert [r["outcome"] for r in result.repairs] == ["enabled"] * 3 + [
        "not applicable"
    ]
    assert "probe fault injected on rank 3" in result.repairs[3]["reason"]
    stock = late_runs[False]

    def group(res, ranks):
        return [
            (s.budgets, s.tiers, s.in_broadcast) for s in res.steps if s.ranks == ranks
        ]

    assert group(result, (2, 3)) == group(stock, (2, 3))
    repaired = [s for s in result.steps if s.ranks == (0, 1)]
    assert repaired and all(s.agree for s in repaired)


def test_four_ranks(planner_cls):
    result = run(scenario=cv.DRIFT, fix=True, tp=4, steps=12)
    assert result.agree, result.summary()
    assert len(result.repairs) == 4


# --------------------------------------------------------------------------
# In-process: the probe, the hook's pass-throughs, instrument/uninstrument.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("instrumented", [False, True])
def test_probe_finds_rank_local_budgets(
    planner_cls, sglang_version, restore_repair, instrumented
):
    """The probe reads the method as SGLang wrote it, hooked or not."""
    module, cls = planner_cls
    if instrumented:
        restore_repair.instrument(apply=True)
    else:
        restore_repair.uninstrument()
    result = dspark_planner.probe(module, cls)
    if not stock_is_wrong(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries #31195")
    assert result.tier_local and not result.agrees
    assert result.tiers[0] != result.tiers[1] == result.own_tier
    expected = (
        sg_planner.SHAPE_FUNCTION
        if hasattr(module, sg_planner.GROUP_FUNCTION)
        else sg_planner.SHAPE_TP_SYNC
    )
    assert result.shape == expected


def test_status_line(planner_cls, sglang_version, restore_repair):
    if not stock_is_wrong(sglang_version):
        pytest.skip(f"sglang {sglang_version} carries #31195")
    restore_repair.uninstrument()
    status = restore_repair.instrument(apply=True)
    assert status.outcome is Outcome.ENABLED, status.line()
    line = status.line()
    assert line.startswith(
        f"sglang-dspark-dp: verify-budget: enabled on sglang {sglang_version}"
    )
    assert "own budget" in line and "#31195 not in this build" in line
    assert "\n" not in line
    assert status.detail["repaired"].startswith("both ranks on graph tier")


class _Recorder:
    def __init__(self):
        self.calls = []

    def __call__(self, group, budget):
        self.calls.append((group, budget))
        return 999


def _planner(module, cls, *, mode, flat=False, world=2):
    group = standins.ReplayGroup(world_size=world)
    rt = standins.runtime(
        tp_size=world,
        disable_overlap_schedule=False,
        sps_table_path=None if flat else "<test>",
    )
    table = sg_planner.profiled_sps_table([(1, 1.0), (3, 0.5)], max_batch_tokens=8)
    swaps = sg_planner.runtime_swaps(
        module, runtime=rt, group=group, mode=mode, sps_table=table
    )
    runner = standins.model_runner(
        req_pool_size=8, capture_num_tokens=[2, 4, 6, 8], max_bs=4
    )
    with swaps:
        planner = sg_planner.build_planner(
            module,
            cls,
            draft_model=standins.draft_model(),
            model_runner=runner,
            runtime=rt,
            group=group,
            gamma=3,
            verify_num_draft_tokens=4,
        )
    return planner, swaps


@pytest.mark.parametrize(
    "mode, flat, world, exchanged",
    [
        ("compact", False, 2, True),  # the case the repair is for
        ("cap-accept", False, 2, True),  # schedules a budget too
        ("compact", False, 1, False),  # one rank: budget untouched
        ("compact", True, 2, False),  # flat SPS table: verify-all
        ("static", False, 2, False),  # no budget planner
    ],
)
def test_hook_exchanges_only_where_a_budget_is_scheduled_on_many_ranks(
    planner_cls, mode, flat, world, exchanged
):
    import torch

    module, cls = planner_cls
    planner, swaps = _planner(module, cls, mode=mode, flat=flat, world=world)
    recorder = _Recorder()
    around = dspark_planner.make_around(
        module,
        sg_planner.group_shape(module),
        GroupVerdict(REPAIR.name, True),
        recorder,
    )

    def original(p, **kw):
        return 7

    with swaps:
        got = around(
            original, planner, resolved=None, req_pool_indices_cpu=torch.arange(2)
        )
    assert bool(recorder.calls) is exchanged
    assert got == (999 if exchanged else 7)


def test_hook_sends_none_as_minus_one(planner_cls):
    assert dspark_planner.to_wire(None) == dspark_planner.NO_BUDGET == -1
    assert dspark_planner.from_wire(-1) is None
    assert dspark_planner.from_wire(0) == 0
    assert dspark_planner.to_wire(52) == 52


def test_instrument_and_uninstrument_are_symmetric_and_idempotent(
    planner_cls, restore_repair, sglang_version
):
    _module, cls = planner_cls
    target = sg_planner.BUDGET_TARGET
    enabled_or_skip(restore_repair, sglang_version)
    restore_repair.uninstrument()
    restore_repair.uninstrument()  # no-op
    stock_fn = cls.__dict__[sg_planner.BUDGET]
    assert not adapter.is_patched(target)
    assert restore_repair.status().outcome is Outcome.NOT_INSTRUMENTED
    first = restore_repair.instrument(apply=True)
    assert first.outcome is Outcome.ENABLED, first.line()
    hooked = cls.__dict__[sg_planner.BUDGET]
    assert hooked is not stock_fn
    assert adapter.is_patched(target)
    assert len(adapter.hooks_on(target)) == 1
    again = restore_repair.instrument(apply=True)
    assert again == first
    assert cls.__dict__[sg_planner.BUDGET] is hooked
    assert len(adapter.hooks_on(target)) == 1
    restore_repair.uninstrument()
    assert cls.__dict__[sg_planner.BUDGET] is stock_fn
    assert not adapter.is_patched(target)
    assert adapter.hooks_on(target) == []
    restore_repair.uninstrument()
    assert cls.__dict__[sg_planner.BUDGET] is stock_fn
    assert restore_repair.instrument(apply=True).outcome is Outcome.ENABLED
    assert len(adapter.hooks_on(target)) == 1


def test_not_needed_where_the_planner_already_agrees_its_budget(
    planner_cls, monkeypatch
):
    """A stand-in "fixed release": the budget method itself broadcasts its
    budget over the verify_lens group, as upstream PR #31195 would. The
    probe sees the ranks agree and patches nothing."""
    import torch

    module, cls = planner_cls
    stock = sg_planner.stock_budget(cls)
    shape = sg_planner.group_shape(module)

    def agreeing_budget(self, *, resolved, req_pool_indices_cpu):
        budget = stock(
            self, resolved=resolved, req_pool_indices_cpu=req_pool_indices_cpu
        )
        group = sg_planner.broadcast_group(self, module, shape)
        t = torch.tensor([-1 if budget is None else budget], dtype=torch.int64)
        group.broadcast(t, src=0)
        return None if int(t.item()) < 0 else int(t.item())

    monkeypatch.setattr(cls, sg_planner.BUDGET, agreeing_budget)
    before = cls.__dict__[sg_planner.BUDGET]
    hooks_before = adapter.hooks_on(sg_planner.BUDGET_TARGET)
    fresh = dspark_planner.VerifyBudgetRepair()
    answer = fresh.setup_once()
    assert isinstance(answer, NotNeeded), answer
    assert "already agrees" in answer.reason
    status = fresh.instrument(apply=True)
    assert status.outcome is Outcome.NOT_NEEDED, status.line()
    assert not fresh.instrumented
    assert cls.__dict__[sg_planner.BUDGET] is before
    assert adapter.hooks_on(sg_planner.BUDGET_TARGET) == hooks_before


def test_not_applicable_without_a_broadcast_group(planner_cls, monkeypatch):
    module, _cls = planner_cls
    for name in (sg_planner.GROUP_FUNCTION, sg_planner.TP_SYNC_CLASS):
        monkeypatch.delattr(module, name, raising=False)
    fresh = dspark_planner.VerifyBudgetRepair()
    status = fresh.instrument(apply=True)
    assert status.outcome is Outcome.NOT_APPLICABLE
    assert "broadcast group is not one this repair can find" in status.reason
    assert not fresh.instrumented


# --------------------------------------------------------------------------
# Bad input.
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(tp=1), ("tp", "1")),
        (dict(tp=True), ("tp", "True")),
        (dict(scenario="storm"), ("scenario", "storm")),
        (dict(mode="static"), ("mode", "static")),
        (dict(steps=0), ("steps", "0")),
        (dict(noise=float("nan")), ("noise", "nan")),
        (dict(late_rank=2), ("late_rank", "2")),
        (dict(probe_fails=(5,)), ("probe_fails", "5")),
        (dict(hang_s=5.0, timeout_s=5.0), ("hang_s", "5.0")),
    ],
)
def test_bad_config_names_the_field(kwargs, words):
    with pytest.raises(cv.CannotRun) as err:
        cv.run_compact_verify(cv.CompactConfig(**kwargs))
    for word in words:
        assert word in str(err.value)
    assert not mp.active_children()


def test_the_summary_counts_broadcasts_per_group_step():
    """Two groups of two over three steps, the broadcast entered at two of
    each group's steps: 4 of 6 group steps, none at the other 2 (never a
    negative count)."""
    from sglang_dspark_dp.harness.compact_verify import (
        CompactConfig,
        CompactResult,
        StepOutcome,
    )

    cfg = CompactConfig(tp=2, groups=2, steps=3)
    steps = tuple(
        StepOutcome(
            step=step,
            ranks=ranks,
            budgets=(8, 8),
            tiers=(32, 32),
            in_broadcast=(step > 0, step > 0),
            late=(False, False),
        )
        for ranks in ((0, 1), (2, 3))
        for step in range(3)
    )
    result = CompactResult(
        config=cfg,
        sglang_version="x",
        repairs=(),
        group_kind="GroupCoordinator",
        steps=steps,
        errors={},
        seconds=0.0,
    )
    line = result.summary()
    assert "agreed at every one of 3 steps" in line, line
    assert "entered by all ranks at 4 of 6 group steps, by none at 2)" in line, line
