"""The consensus watch (:mod:`sglang_dspark_dp.watch`) on the installed
SGLang: off, nothing of it exists; on, it names the decision the ranks part
ways on before the collective it leads to, and stays silent where the
plugin's repairs make the ranks agree.

The gloo runs are the startup and compact-verify harnesses' (one process
per rank, two groups side by side, the second starting at rank 2), with
the watch hooked in every rank after the repairs, as a server's arming
hooks it. In ``exit`` mode a rank that finds a divergence logs its line
and ends; the line is read from the ranks' stderr.
"""

from __future__ import annotations

import logging
import os
import threading

import pytest
from known_releases import known
from srt_helpers import no_children_left

from sglang_dspark_dp import adapter, registry, settings, watch, watch_sites
from sglang_dspark_dp.adapter import planner as sg_planner
from sglang_dspark_dp.adapter import worker as sg_worker
from sglang_dspark_dp.drivers import DRAFT_WIDTH
from sglang_dspark_dp.harness import compact_verify, entry, lockstep, startup

HANG_S = 3.0
PART = "part ways on"


def releases_row(version: str) -> dict:
    row = known(version)
    if row is None:
        pytest.skip(f"stock behaviour of sglang {version} is not recorded")
    return row


def alarm_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "watch:" in line and PART in line]


def run_startup(**kwargs) -> startup.StartupResult:
    result = startup.run_startup(
        startup.StartupConfig(hang_s=HANG_S, timeout_s=90.0, **kwargs)
    )
    assert no_children_left()
    return result


# --------------------------------------------------------------------------
# Off: no hook, no thread, no group. On: the sites, outside the repairs.
# --------------------------------------------------------------------------


@pytest.fixture
def watch_env(monkeypatch):
    """The watch's variables as the test sets them; the sites unhooked and
    the repairs as they were afterwards."""
    was = {r.name for r in registry.repairs() if r.instrumented}
    monkeypatch.delenv(settings.WATCH_ENV, raising=False)
    monkeypatch.delenv(settings.WATCH_MODE_ENV, raising=False)
    yield monkeypatch
    watch_sites.uninstrument()
    watch.shutdown()
    for r in registry.repairs():
        if r.name not in was:
            r.uninstrument()


def watch_hooks(target: str) -> list:
    names = [getattr(h, "__name__", "") for h in adapter.hooks_on(target)]
    return [n for n in names if n.startswith("watch_")]


def test_off_the_arming_adds_no_hook_no_thread_no_group(watch_env):
    watch_sites.load_site_modules()
    statuses: list = []
    arming = registry._Arming(statuses.extend)
    arming.settle()
    assert statuses, "the arming instrumented nothing (the modules are imported)"
    assert watch_sites.hooked() == []
    assert watch_hooks(adapter.STARTUP_TARGET) == []
    assert watch_hooks(sg_planner.LAYOUT_TARGET) == []
    assert watch.threads() == []
    assert not any(
        t.name.startswith("sglang-dspark-dp-watch") for t in threading.enumerate()
    )
    assert watch.channels() == []


def test_on_the_arming_hooks_each_site_outside_the_repairs(watch_env):
    watch_env.setenv(settings.WATCH_ENV, "1")
    watch_sites.load_site_modules()
    arming = registry._Arming(lambda statuses: None)
    arming.settle()
    assert watch_sites.hooked() == [
        "startup",
        "compact-verify",
        "draft-batch",
        "worker-entry",
    ]
    targets = (
        adapter.STARTUP_TARGET,
        sg_planner.LAYOUT_TARGET,
        adapter.TARGET,
        sg_worker.FORWARD_TARGET,
    )
    for target in targets:
        hooks = adapter.hooks_on(target)
        assert watch_hooks(target), f"no watch hook on {target}"
        # Registered last: the outermost wrapper, it sees the repaired call.
        assert getattr(hooks[-1], "__name__", "").startswith("watch_"), hooks
        assert adapter.is_patched(target)
        # SGLang's registry knows whose hooks these are (its warning about
        # several AROUND hooks on one method names the plugin).
        assert set(adapter.hook_origins(target)) == {"dspark_dp"}, target
    # Hooking alone starts nothing: threads and groups come with a group's
    # first decision.
    assert watch.threads() == []
    watch_sites.uninstrument()
    assert watch_hooks(adapter.STARTUP_TARGET) == []
    assert watch_hooks(sg_planner.LAYOUT_TARGET) == []
    assert watch_hooks(adapter.TARGET) == []
    assert watch_hooks(sg_worker.FORWARD_TARGET) == []


def test_an_unknown_mode_is_one_line_and_the_default_stays(watch_env, caplog):
    value = f"Loud-{os.getpid()}"
    watch_env.setenv(settings.WATCH_MODE_ENV, value)
    with caplog.at_level(logging.WARNING, logger="sglang_dspark_dp"):
        assert watch.mode() == watch.EXIT
        assert watch.mode() == watch.EXIT
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert settings.WATCH_MODE_ENV in lines[0] and repr(value) in lines[0]
    assert "exit/log" in lines[0]
    watch_env.setenv(settings.WATCH_MODE_ENV, " LOG ")
    assert watch.mode() == watch.LOG


# --------------------------------------------------------------------------
# Startup: the capture decision, named before the capture barrier.
# --------------------------------------------------------------------------


def test_stock_plain_tp_the_watch_names_the_capture_decision_not_a_hang(
    sglang_version, capfd
):
    if not releases_row(sglang_version)["startup_tp"]:
        pytest.skip(f"sglang {sglang_version} agrees on draft capture under plain TP")
    result = run_startup(tp=2, groups=2, fix=False, watch="exit")
    err = capfd.readouterr().err
    lines = alarm_lines(err)
    # Ranks 2 and 3 (rank 3 short of memory) each say it once, then end.
    assert len(lines) == 2, err[-3000:]
    for line in lines:
        assert "ranks [2, 3] part ways on the draft CUDA-graph capture" in line
        assert "at startup" in line
        assert "rank 2: capture=True (read 40.00 GiB free)" in line
        assert "rank 3: capture=False (read 0.60 GiB free)" in line
        assert "#33614 spec-tp-sync" in line
        assert "no repair stands in for it here" in line
    by_rank = {r.rank: r for r in result.ranks}
    assert not result.hung, result.summary()
    for rank in (2, 3):
        assert "exit code 1" in by_rank[rank].detail, by_rank[rank]
    for rank in (0, 1):  # the other group has no short rank and agrees
        assert by_rank[rank].decision == startup.CAPTURED


def test_stock_dp_attention_the_watch_names_39954(sglang_version, capfd):
    if not releases_row(sglang_version)["startup_dp"]:
        pytest.skip(f"sglang {sglang_version} agrees on draft capture under DP")
    result = run_startup(tp=4, dp=4, fix=False, watch="exit")
    lines = alarm_lines(capfd.readouterr().err)
    assert len(lines) == 4, lines
    for line in lines:
        assert "ranks [0, 1, 2, 3] part ways on the draft CUDA-graph capture" in line
        assert "rank 3: capture=False" in line
        assert "#39954 capture-group-memory" in line
    assert not result.hung, result.summary()


def test_with_the_plugin_the_watch_is_silent(capfd):
    result = run_startup(tp=2, groups=2, fix=True, watch="exit")
    err = capfd.readouterr().err
    assert alarm_lines(err) == [], err[-3000:]
    assert result.correct, result.summary()
    assert all(r.alarms == () for r in result.ranks)


def test_log_mode_logs_dumps_the_flight_recorder_and_serves_on(
    sglang_version, monkeypatch, tmp_path
):
    row = releases_row(sglang_version)
    if not (row["startup_tp"] or row["startup_dp"]):
        pytest.skip(f"sglang {sglang_version} agrees on draft capture")
    from sglang_dspark_dp import flight_dump
    from sglang_dspark_dp.harness import flight

    monkeypatch.setenv(flight_dump.BUFFER_ENV, "200")
    monkeypatch.setenv(flight_dump.DUMP_ENV, str(tmp_path / "trace_rank_"))
    # Plain TP where the release parts there, else DP attention (attention
    # TP 1, the draft capturing on the TP group).
    dp = 1 if row["startup_tp"] else 2
    result = run_startup(tp=2, dp=dp, fix=False, watch="log")
    for r in result.ranks:
        assert len(r.alarms) == 1, r
        assert "draft CUDA-graph capture" in r.alarms[0]
        assert "SGLANG_DSPARK_DP_WATCH=log" in r.alarms[0]
        # Said before the draft worker was told, so before any barrier.
        assert r.alarms_before_capture == 1, r
        dumped = tmp_path / f"trace_rank_{r.rank}"
        assert f"flight recorder dumped to {dumped}" in r.alarms[0]
    dumps = flight.load_dir(str(tmp_path))
    assert sorted(dumps) == [0, 1]
    assert all(d.entries for d in dumps.values()), dumps
    # Served on: the short rank skipped capture, the other went on into the
    # capture barrier and waited there (the stock hang, now named).
    by_rank = {r.rank: r for r in result.ranks}
    assert by_rank[1].decision == startup.SKIPPED
    assert by_rank[0].decision == startup.HUNG


def test_a_rank_that_cannot_watch_leaves_its_group_unwatched_not_hung(capfd):
    result = run_startup(tp=2, groups=2, fix=True, watch="exit", watch_fails=(3,))
    err = capfd.readouterr().err
    assert result.correct, result.summary()
    said = [line for line in err.splitlines() if "serves unwatched" in line]
    assert len(said) == 2, err[-3000:]  # ranks 2 and 3, one line each
    assert any("this rank's watch failed (fault injected" in line for line in said)
    assert any("another rank's watch failed" in line for line in said)


# --------------------------------------------------------------------------
# Compact verify: the budget and the graph tier, every step.
# --------------------------------------------------------------------------


def run_compact(**kwargs) -> compact_verify.CompactResult:
    result = compact_verify.run_compact_verify(
        compact_verify.CompactConfig(
            scenario=compact_verify.DRIFT,
            tp=2,
            groups=2,
            steps=12,
            hang_s=HANG_S,
            timeout_s=90.0,
            **kwargs,
        )
    )
    assert no_children_left()
    return result


def test_stock_compact_verify_the_watch_names_the_budget_and_31195(sglang_version):
    """Stock: the ranks resolve different budgets before they run different
    verify tiers. The watch names the budget at the first step the ranks'
    budgets differ, with each rank's; the tiers that follow from it at the
    same step are not named again."""
    if not releases_row(sglang_version)["compact_verify"]:
        pytest.skip(f"sglang {sglang_version} agrees on the verify tier")
    result = run_compact(fix=False, watch="log")
    assert result.diverged, result.summary()
    ranks = result.diverged[0].ranks
    parted = [s for s in result.steps if s.ranks == ranks and len(set(s.budgets)) > 1]
    assert parted and parted[0].step <= result.diverged[0].step, result.summary()
    lines = result.alarms[ranks[0]]
    assert lines, result.summary()
    assert "the compact-verify budget decision" in lines[0], lines
    assert f"at step {parted[0].step}:" in lines[0], lines
    for rank, value in zip(ranks, parted[0].budgets, strict=True):
        assert f"rank {rank}: budget={value}" in lines[0], lines
    assert not [
        x
        for x in lines
        if "the verify graph tier decision" in x and f"at step {parted[0].step}:" in x
    ], lines
    for line in lines:
        assert "#31195 verify-budget-broadcast" in line
        assert "SGLANG_DSPARK_DP_WATCH=log" in line


def test_with_the_plugin_compact_verify_is_silent(capfd):
    result = run_compact(fix=True, watch="exit")
    err = capfd.readouterr().err
    assert alarm_lines(err) == [], err[-3000:]
    assert result.complete and result.agree, result.summary()
    assert all(lines == () for lines in result.alarms.values())


def test_one_rank_handed_another_budget_is_named_with_the_plugin_on(capfd):
    """The plugin on (the ranks agree on every budget they resolve), and one
    rank of the second group (world rank 3) hands ``schedule_layout`` a
    budget one higher at step 4: the watch names that decision at that step
    with both ranks' values, in both ranks of that group, and nothing in
    the first group."""
    if "compact-verify" not in [s["site"] for s in watchable()]:
        pytest.skip("this build's planner runs no verify_lens broadcast")
    result = run_compact(fix=True, watch="log", skew_budget=(3, 4))
    for rank in (0, 1):
        assert result.alarms.get(rank, ()) == (), result.alarms
    for rank in (2, 3):
        lines = result.alarms[rank]
        assert lines, result.summary()
        first = lines[0]
        assert "ranks [2, 3] part ways on the compact-verify budget decision" in first
        assert "at step 4:" in first, first
        budgets = {
            r: int(first.split(f"rank {r}: budget=")[1].split(";")[0]) for r in (2, 3)
        }
        assert budgets[3] == budgets[2] + 1, first
        assert "#31195 verify-budget-broadcast" in first, first


def watchable() -> list[dict]:
    return [s for s in watch_sites.survey() if s["watchable"]]


# --------------------------------------------------------------------------
# verify --watch: each defect named first by the watch; silent with the fix.
# --------------------------------------------------------------------------

WATCH_VERIFY = ["verify", "--steps", "5", "--dp", "4", "--no-progress", "--watch"]


def watch_said(stdout: str) -> list[str]:
    return [x.strip() for x in stdout.splitlines() if x.startswith("  watch:")]


def test_verify_watch_names_each_defect_first_and_stays_silent_with_the_fix(
    plugin, sglang_version
):
    from known_releases import backport_fixes
    from srt_helpers import cli

    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    row = releases_row(sglang_version)
    stock = cli([*WATCH_VERIFY, "--no-fix"])
    assert stock.returncode == 1, stock.stdout + stock.stderr[-2000:]
    said = watch_said(stock.stdout)
    assert said, stock.stdout
    # Named first, or (the 0.5.16 draft crash every rank takes alike) silent.
    named = [x for x in said if x.startswith("watch: named it first: ")]
    silent = [x for x in said if x.startswith("watch: silent: ")]
    assert len(named) + len(silent) == len(said), said
    capture = [x for x in said if "draft CUDA-graph capture decision" in x]
    if row["startup_tp"] or row["startup_dp"]:
        assert capture, said
    if row["compact_verify"]:
        assert any("#31195 verify-budget-broadcast" in x for x in said), said
    # The non-overlap entry on --dp ranks: refused alike, so no line of its own.
    alike = "watch: silent: every rank's steps were refused alike (above)"
    assert (alike in said) is bool(row["non_overlap"]), said
    fixed = cli(WATCH_VERIFY)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr[-2000:]
    assert watch_said(fixed.stdout) == [], fixed.stdout


def test_verify_watch_fails_a_run_whose_ranks_saw_other_sync_sizes(
    plugin, monkeypatch, capsys
):
    """The plugin on, and one rank (world rank 2) sees other DP sync sizes
    at step 2 (the harness's test hook): verify --watch's decode phase (its
    arguments parsed by the CLI's own parser) exits 1 with the watch's line
    naming the draft DP sync sizes, whether or not the harness's own checks
    see the ranks part."""
    from known_releases import backport_fixes

    from sglang_dspark_dp.cli import build_parser, verify

    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    monkeypatch.setenv(lockstep.FAULT_ENV, "sizes:2:1:2")
    args = build_parser().parse_args(
        ["verify", "--steps", "4", "--dp", "4", "--no-progress", "--watch"]
    )
    assert verify._decode_phase(args) == 1
    out = capsys.readouterr().out
    assert no_children_left()
    said = watch_said(out)
    draft = [x for x in said if "part ways on the draft DP sync sizes decision" in x]
    assert draft, out
    assert draft[0].startswith("watch: named"), draft
    assert "verify: FAILED" in out, out


def run_late(**kwargs) -> compact_verify.CompactResult:
    result = compact_verify.run_compact_verify(
        compact_verify.CompactConfig(
            scenario=compact_verify.LATE,
            tp=2,
            groups=2,
            steps=12,
            late_every=3,
            hang_s=HANG_S,
            timeout_s=90.0,
            **kwargs,
        )
    )
    assert no_children_left()
    return result


def test_a_late_relay_is_named_with_relay_wait_and_silent_with_the_plugin(
    sglang_version, capfd
):
    if not releases_row(sglang_version)["late_relay"]:
        pytest.skip(f"sglang {sglang_version} waits for a late confidence copy")
    stock = run_late(fix=False, watch="log")
    assert not stock.agree or stock.late_steps, stock.summary()
    said = [line for lines in stock.alarms.values() for line in lines]
    assert said, stock.summary()
    first = said[0]
    assert "verify" in first and "relay-wait" in first, said
    assert "#31195 verify-budget-broadcast" in first, said
    capfd.readouterr()  # the stock run's lines
    fixed = run_late(fix=True, watch="exit")
    err = capfd.readouterr().err
    assert alarm_lines(err) == [], err[-3000:]
    assert fixed.complete and fixed.agree, fixed.summary()


# --------------------------------------------------------------------------
# The draft batch: DP sync sizes and graph admission, every draft step.
# --------------------------------------------------------------------------


def run_draft(monkeypatch, fault: str | None, **kwargs) -> lockstep.RunResult:
    if fault is None:
        monkeypatch.delenv(lockstep.FAULT_ENV, raising=False)
    else:
        monkeypatch.setenv(lockstep.FAULT_ENV, fault)
    result = lockstep.run(
        lockstep.RunConfig(dp=4, ep_sizes=(1,), timeout_s=60.0, watch="log", **kwargs)
    )
    assert no_children_left()
    return result


def test_with_the_plugin_the_draft_batch_is_silent(monkeypatch):
    result = run_draft(monkeypatch, None, steps=40)
    assert result.healthy, result.failure.render()
    assert result.steps_done == {1: 40}
    assert result.alarms == {r: () for r in range(4)}


def test_one_rank_seeing_other_sync_sizes_is_named_with_the_plugin_on(monkeypatch):
    """The plugin on, and world rank 2 alone sees the first DP rank's count
    one higher at step 6 (an input of the draft batch's decisions): every
    rank names the draft DP sync sizes at step 6, rank 2's sizes one draft
    block wider in the first place, and #33098."""
    result = run_draft(monkeypatch, "sizes:2:1:6", steps=12)
    width = None
    for rank in range(4):
        lines = result.alarms.get(rank)
        assert lines, (rank, result.alarms)
        first = lines[0]
        assert "ranks [0, 1, 2, 3] part ways on the draft DP sync sizes" in first
        assert "at step 6:" in first, first
        assert "#33098 dp-draft-metadata" in first, first
        sizes = {
            r: first.split(f"rank {r}: sizes=[")[1].split("]")[0].split(", ")
            for r in range(4)
        }
        assert sizes[0] == sizes[1] == sizes[3] != sizes[2], first
        assert sizes[2][1:] == sizes[0][1:], first
        width = int(sizes[2][0]) - int(sizes[0][0])
        assert width > 0, first
    assert width == DRAFT_WIDTH  # one request more: one draft block wider


# --------------------------------------------------------------------------
# The worker's step entry: the scheduler's non-overlap call reaching it.
# --------------------------------------------------------------------------


def run_entry(**kwargs) -> entry.EntryResult:
    result = entry.run_entry(entry.EntryConfig(hang_s=HANG_S, **kwargs))
    assert no_children_left()
    return result


@pytest.mark.parametrize(
    "field, value, says",
    [
        ("unrepaired", (4,), "unrepaired must name ranks 0-3, got [4]"),
        ("decode_steps", -1, "decode_steps must be a non-negative integer, got -1"),
        ("watch", "loud", "watch must be None, 'log' or 'exit', got 'loud'"),
        ("groups", 5, "groups must be an integer between 1 and 4"),
    ],
)
def test_an_entry_run_names_the_field_it_cannot_take(field, value, says):
    with pytest.raises(entry.CannotRun) as err:
        entry.run_entry(entry.EntryConfig(**{field: value}))
    assert says in str(err.value)


def test_with_the_plugin_every_step_entry_is_watched_and_silent():
    """Two TP groups (the second at ranks 2-3), a prefill and three decode
    steps through the installed ``Scheduler.run_batch`` with the overlap
    schedule off: every step reaches the worker's body on every rank, each
    rank's watch compared its four entries over its own group, no alarm."""
    result = run_entry(fix=True)
    assert result.errors() == {}
    for rank, report in result.reports.items():
        assert [s["reached"] for s in report["steps"]] == [
            "prefill",
            *["decode"] * 3,
        ], (rank, report["steps"])
        mine = "0,1" if rank < 2 else "2,3"
        assert report["watched"][mine] == 4, (rank, report["watched"])
    assert result.alarms() == []


def test_a_rank_whose_call_is_refused_is_named_beside_the_peers_that_went_on(
    sglang_version,
):
    """Where the scheduler's non-overlap call passes ``pp_proxy_tensors``
    and the worker does not take it (#39262), the repair applied on every
    rank but world rank 3: ranks 2 and 3 name the worker step entry at step
    0, rank 2 reaching the body and rank 3 refused with the server's
    ``TypeError``, and #39262; ranks 0-1 are silent. Stock on every rank,
    every rank is refused alike: no line (the crash names itself)."""
    if not releases_row(sglang_version)["non_overlap"]:
        pytest.skip(f"sglang {sglang_version}: the non-overlap call reaches the worker")
    split = run_entry(fix=True, unrepaired=(3,), decode_steps=1)
    lines = split.alarms()
    assert len(lines) == 2, lines
    for line in lines:
        assert "ranks [2, 3] part ways on the worker step entry decision" in line
        assert "at step 0:" in line, line
        assert "rank 2: reached the worker's body" in line, line
        assert "rank 3: refused at the call: TypeError" in line, line
        assert "pp_proxy_tensors" in line, line
        assert "#39262 non-overlap-pp-proxy" in line, line
    assert [r["alarms"] for r in (split.reports[0], split.reports[1])] == [[], []]
    alike = run_entry(fix=False, decode_steps=1)
    assert alike.alarms() == []
    for report in alike.reports.values():
        assert all(s["error"].startswith("TypeError") for s in report["steps"])


def made_entry(steps: dict[int, list], alarms: dict[int, list]) -> entry.EntryResult:
    return entry.EntryResult(
        {
            r: {
                "steps": [
                    {"reached": s, "error": None if s else "TypeError"} for s in st
                ],
                "error": "",
                "alarms": alarms.get(r, []),
                "watched": {},
            }
            for r, st in steps.items()
        }
    )


def test_verify_reads_the_entry_watch_by_how_the_ranks_steps_went():
    """``verify --watch``'s non-overlap phase: no line where every step of
    every rank reached the worker; silent where all were refused alike; a
    line naming the worker step entry where the ranks' steps went apart;
    MISSED without one, FALSE ALARM with one where nothing parted."""
    from sglang_dspark_dp.cli import verify

    reached = {2: ["prefill", "decode"], 3: ["prefill", "decode"]}
    refused = {2: [None, None], 3: [None, None]}
    apart = {2: ["prefill", "decode"], 3: [None, None]}
    line = (
        f"sglang-dspark-dp: watch: ranks [2, 3] part ways on {verify.ENTRY} at step 0"
    )
    assert verify.entry_watch(made_entry(reached, {})) == (True, [])
    ok, said = verify.entry_watch(made_entry(refused, {}))
    assert ok and said == [
        "watch: silent: every rank's steps were refused alike (above)"
    ]
    assert verify.entry_watch(made_entry(apart, {2: [line], 3: [line]})) == (
        False,
        [f"watch: named it first: {line}"],
    )
    ok, said = verify.entry_watch(made_entry(apart, {}))
    assert not ok and said[0].startswith("watch: MISSED"), said
    ok, said = verify.entry_watch(made_entry(reached, {2: [line]}))
    assert not ok and said[0].startswith("watch: FALSE ALARM"), said


# --------------------------------------------------------------------------
# SGLang's own checker (0.5.19+): it receives DSpark's decisions.
# --------------------------------------------------------------------------


def checker_events(lines: tuple[str, ...]) -> int:
    passed = [x for x in lines if "Consensus check passed for" in x]
    return sum(int(x.split("passed for ")[1].split()[0]) for x in passed)


def test_sglang_own_checker_receives_dspark_decisions_and_catches_a_divergence():
    """Plain TP, two TP groups (the second at ranks 2-3), SGLang's real
    ``configure`` on its ``GroupCoordinator``s over gloo: without a skew it
    compares every one of the three compact-verify decisions of each step,
    silently; with world rank 3 handed a budget one higher at step 4, its
    own critical line in ranks 2 and 3 lists DSpark's budget event of that
    step, with each rank's value, and it ends them; the first group serves
    on."""
    from sglang_dspark_dp.adapter import checker

    try:
        checker.load()
    except ImportError:
        pytest.skip("this SGLang has no rank consensus checker (before 0.5.19)")
    if "compact-verify" not in [s["site"] for s in watchable()]:
        pytest.skip("this build's planner runs no verify_lens broadcast")
    clean = run_compact(fix=True, watch="log", sglang_checker=True)
    assert clean.complete and clean.agree, clean.summary()
    for rank in range(4):
        lines = clean.checker[rank]
        assert not [x for x in lines if x.startswith("CRITICAL")], lines
        assert checker_events(lines) == 3 * 12, lines
    skewed = run_compact(fix=True, watch="log", sglang_checker=True, skew_budget=(3, 4))
    for rank in (0, 1):
        assert rank not in skewed.errors, skewed.errors
        assert checker_events(skewed.checker[rank]) == 3 * 12
    budgets = {}
    for rank in (2, 3):
        assert "exit code 1" in skewed.errors[rank], skewed.errors
        critical = [x for x in skewed.checker[rank] if x.startswith("CRITICAL")]
        assert len(critical) == 1, skewed.checker[rank]
        assert "Found rank divergence" in critical[0], critical
        marker = "sglang-dspark-dp: compact-verify budget at step 4: "
        assert marker in critical[0], critical
        budgets[rank] = int(critical[0].split(marker)[1].split("'")[0])
    assert budgets[3] == budgets[2] + 1, budgets
