"""The watch's alarm line, built from gathered events (no SGLang, no
process group): the decision, the step, every rank's value, the upstream
change and whether a repair stands in for it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_dspark_dp import watch
from sglang_dspark_dp.outcome import Outcome, Status
from sglang_dspark_dp.upstream import State, Verdict

CHANGES = ("verify-budget-broadcast",)


def event(decision: str, step, key, shown: str) -> watch.Event:
    return watch.Event(decision, step, key, shown, CHANGES)


def repair(outcome: Outcome, state: State):
    verdict = Verdict("verify-budget-broadcast", state, "measured")
    status = Status("verify-budget", outcome, "why", verdicts=(verdict,))
    return SimpleNamespace(
        name="verify-budget",
        stands_in_for=CHANGES,
        status=lambda: status,
        verdicts=(verdict,),
    )


@pytest.fixture
def repairs():
    found: list = []
    watch.tell_repairs(lambda: found)
    yield found
    watch.tell_repairs(watch._no_repairs)


def test_the_line_names_decision_step_values_and_the_change(repairs):
    repairs.append(repair(Outcome.NOT_INSTRUMENTED, State.NOT_IN))
    gathered = [
        [event("budget", 0, 9, "budget=9"), event("tier", 0, 32, "tier=32")],
        [event("budget", 0, 9, "budget=9"), event("tier", 0, 48, "tier=48")],
    ]
    assert watch.differences(gathered) == [1]
    line = watch.alarm_line((2, 3), gathered, 1)
    assert line.startswith("sglang-dspark-dp: watch: ranks [2, 3] part ways on ")
    assert "the tier decision at step 0: rank 2: tier=32; rank 3: tier=48" in line
    assert "#31195 verify-budget-broadcast (not in this build;" in line
    assert "no repair stands in for it here (verify-budget: not instrumented)" in line


def test_the_line_says_when_a_repair_stands_in(repairs):
    repairs.append(repair(Outcome.ENABLED, State.NOT_IN))
    line = watch.change_text(list(CHANGES))
    assert "the verify-budget repair stands in for it here" in line


def test_ranks_at_different_decisions_are_named_each(repairs):
    gathered = [
        [event("budget", 4, 9, "budget=9")],
        [event("tier", 3, 48, "tier=48")],
    ]
    line = watch.alarm_line((0, 1), gathered, 0)
    assert "the order of decisions (budget, tier)" in line
    assert "rank 0: budget at step 4: budget=9" in line
    assert "rank 1: tier at step 3: tier=48" in line


def test_equal_batches_have_no_difference():
    same = [[event("budget", 0, 1, "budget=1")]] * 3
    assert watch.differences(same) == []
