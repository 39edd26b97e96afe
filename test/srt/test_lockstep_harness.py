"""The DP lockstep harness: one process per DP rank (gloo over loopback),
the real DSpark draft builder and the real ``can_run_graph`` in each."""

from __future__ import annotations

import multiprocessing as mp
import socket
import time

import pytest
from srt_helpers import SOAK_SUMMARIES, run_python

from sglang_dspark_dp.harness import churn, lockstep

KNOWN_DP_BROKEN = {"0.5.16": True, "0.5.17": False, "0.5.23": False}


def no_children_left():
    deadline = time.monotonic() + 10
    while mp.active_children() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not mp.active_children()


@pytest.mark.parametrize("dp", (2, 4, 8))
def test_soak_2000_steps_ep_off_and_on(plugin, dp):
    cfg = lockstep.RunConfig(dp=dp, ep_sizes=(1, dp), steps=2000, seed=100 + dp)
    result = lockstep.run(cfg)
    assert result.failure is None, result.failure.render()
    assert result.steps_done == {1: 2000, dp: 2000}
    for tiers in result.tiers.values():
        assert sum(tiers.values()) == 2000
        seen_tiers = {k[0] for k in tiers}
        assert "0 (all idle)" in seen_tiers, seen_tiers
        assert ">128 (eager)" in seen_tiers, seen_tiers
        assert any(k[1] == dp - 1 for k in tiers), "no single-busy step"
        eager = sum(n for k, n in tiers.items() if k[2] == "eager")
        assert eager == sum(n for k, n in tiers.items() if k[0].startswith(">"))
    assert no_children_left()
    for ep, tiers in sorted(result.tiers.items()):
        graph = sum(n for k, n in tiers.items() if k[2] == "graph")
        idle = sum(n for k, n in tiers.items() if k[0].startswith("0 "))
        single = sum(n for k, n in tiers.items() if k[1] == dp - 1)
        SOAK_SUMMARIES.append(
            f"dp {dp}, EP {ep}: 2000 steps in lockstep: {graph} graph / "
            f"{2000 - graph} eager, {idle} all-idle, {single} single-busy "
            f"(sglang {result.sglang_version}, plugin {result.plugin}, "
            f"{result.seconds:.0f} s for both EP tiers)"
        )


def test_churn_covers_the_reported_reproduction():
    dp, steps = 4, 2000
    plan = churn.phase_plan(3, steps, dp)
    assert {p.kind for p in plan} == set(churn.PHASES)
    ranks = [churn.RankChurn(seed=3, rank=r, dp=dp, steps=steps) for r in range(dp)]
    rows = [[rk.count(t) for rk in ranks] for t in range(steps)]
    for ph in plan:
        window = rows[ph.start : ph.end]
        if ph.kind == "repro":
            assert all(sum(r) <= 4 for r in window)
            assert any(0 < sum(r) for r in window)
        if ph.kind == "all_idle":
            assert all(sum(r) == 0 for r in window)
        if ph.kind == "single":
            assert all(
                c == 0 for r in window for i, c in enumerate(r) if i != ph.busy_rank
            )
    assert max(max(r) for r in rows) > 128
    # same seed, same churn; other seed, other churn
    again = [churn.RankChurn(seed=3, rank=r, dp=dp, steps=steps) for r in range(dp)]
    assert [[rk.count(t) for rk in again] for t in range(steps)] == rows


def test_no_fix_shows_the_stock_crash_where_expected(plugin, sglang_version):
    if sglang_version not in KNOWN_DP_BROKEN:
        pytest.skip(f"no recorded behaviour for sglang {sglang_version}")
    result = lockstep.run(lockstep.RunConfig(dp=4, ep_sizes=(4,), steps=40, fix=False))
    if KNOWN_DP_BROKEN[sglang_version]:
        assert result.failure is not None
        assert result.failure.kind == "crash"
        assert "'NoneType' object is not iterable" in result.failure.detail
        assert result.failure.step == 0
    else:
        assert result.failure is None, result.failure.render()
    assert no_children_left()


@pytest.mark.parametrize("dp", (0, -1, 1, 17))
def test_bad_dp_is_refused(dp):
    with pytest.raises(lockstep.CannotRun, match="--dp must be"):
        lockstep.run(lockstep.RunConfig(dp=dp, ep_sizes=(1,), steps=5))


def test_port_in_use_is_refused(plugin):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(lockstep.CannotRun, match=f"port {port} is in use"):
            lockstep.run(lockstep.RunConfig(dp=2, ep_sizes=(1,), steps=5, port=port))


def test_a_rank_that_dies_ends_the_run_cleanly(plugin, monkeypatch):
    monkeypatch.setenv(lockstep.FAULT_ENV, "die:1:1:25")
    start = time.monotonic()
    with pytest.raises(lockstep.CannotRun, match="DP rank 1 died"):
        lockstep.run(lockstep.RunConfig(dp=4, ep_sizes=(1,), steps=200, timeout_s=20))
    assert time.monotonic() - start < 60
    assert no_children_left()


CLI = "import sys; from sglang_dspark_dp.cli import main; sys.exit(main({argv!r}))"


def cli(argv, **env):
    return run_python(CLI.format(argv=list(argv)), env=env)


def test_cli_verify_exit_codes(plugin, sglang_version):
    ok = cli(["verify", "--steps", "30", "--dp", "2", "--no-progress"])
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert "verify: OK" in ok.stdout
    assert "graph-size tier" in ok.stdout and "ranks agree" in ok.stdout
    bad = cli(["verify", "--dp", "0"])
    assert bad.returncode == 2 and "--dp must be between 2 and 16, got 0" in bad.stderr
    if KNOWN_DP_BROKEN.get(sglang_version):
        nofix = cli(
            ["verify", "--steps", "10", "--dp", "2", "--no-fix", "--no-progress"]
        )
        assert nofix.returncode == 1, nofix.stdout + nofix.stderr[-2000:]
        assert "stock DSpark crashes under DP attention" in nofix.stdout
        assert "Traceback" not in nofix.stdout + nofix.stderr


def test_cli_doctor_json(plugin):
    import json

    proc = cli(["doctor", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["dspark_present"] is True
    assert report["entry_point_registered"] is True
    assert report["plugin_loaded"] is True
    assert report["bug_detected"] is plugin.probe.affected
    assert report["repair_applied"] is plugin.plan.patches
    assert report["guard"] is False
    guarded = cli(["doctor", "--json"], SGLANG_DSPARK_DP_CHECK="1")
    assert json.loads(guarded.stdout)["guard"] is True


def test_cli_doctor_without_dspark():
    code = (
        "import sys\n"
        "sys.modules['sglang.srt.speculative.dspark_components.dspark_draft'] = None\n"
        + CLI.format(argv=["doctor"])
    )
    proc = run_python(code)
    assert proc.returncode == 2
    assert "DSpark present" in proc.stdout and "no DSpark draft module" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_cli_verify_without_dspark_exits_2():
    code = (
        "import sys\n"
        "sys.modules['sglang.srt.speculative.dspark_components.dspark_draft'] = None\n"
        + CLI.format(argv=["verify", "--steps", "5"])
    )
    proc = run_python(code)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert "cannot run" in proc.stderr and "no DSpark draft module" in proc.stderr


def decision(admitted=1, bucket=4, padded=16, cpu=0, dev=-1, max_unscaled=4, count=0):
    return [1, admitted, bucket, padded, cpu, dev, max_unscaled, count]


def test_judge_names_step_rank_and_values():
    counts, width = [4, 0], 4
    good = [decision(cpu=16, count=4), decision(cpu=0)]
    assert lockstep._judge(7, 2, good, counts, False, width) is None
    split = [decision(cpu=16, count=4), decision(admitted=0, bucket=0, cpu=0)]
    f = lockstep._judge(7, 2, split, counts, False, width)
    assert (f.kind, f.step, f.ep, f.rank) == ("disagreement", 7, 2, 1)
    assert "admitted" in f.detail and f.values["admitted"] == [1, 0]
    assert "step 7 (EP 2, rank 1)" in f.render()
    wrong = [decision(cpu=15, count=4), decision(cpu=0)]
    f = lockstep._judge(3, 1, wrong, counts, False, width)
    assert (f.kind, f.rank, f.values["expected"], f.values["got"]) == (
        "wrong value",
        0,
        16,
        15,
    )
    device = [decision(cpu=16, dev=0, count=4), decision(cpu=0, dev=0)]
    f = lockstep._judge(3, 2, device, counts, True, width)
    assert f.kind == "wrong value" and "device" in f.detail and f.rank == 0
    crashed = [decision(cpu=16, count=4), [0, 0, 0, 0, -1, -1, -1, 0]]
    f = lockstep._judge(0, 1, crashed, counts, False, width)
    assert (f.kind, f.rank) == ("crash", 1)


def test_harness_names_the_code_that_wrote_the_sync_sizes(plugin):
    result = lockstep.run(lockstep.RunConfig(dp=2, ep_sizes=(1,), steps=20))
    assert result.failure is None, result.failure.render()
    assert result.sync_writer.endswith("dp_attn._update_gather_batch")


def test_a_failing_sglang_sync_writer_fails_verify_not_bypassed():
    """If SGLang's ``_update_gather_batch`` cannot be driven, the harness
    must not write the fields itself and call SGLang healthy."""
    code = (
        "import sys\n"
        "from sglang.srt.managers.scheduler_components import dp_attn\n"
        "def broken(*a, **k):\n"
        "    raise RuntimeError('forced failure')\n"
        "dp_attn._update_gather_batch = broken\n"
        + CLI.format(argv=["verify", "--steps", "10", "--dp", "2", "--no-progress"])
    )
    proc = run_python(code, env={"SGLANG_DSPARK_DP_START_METHOD": "fork"})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("verify: FAILED")]
    assert line, proc.stdout
    assert "_update_gather_batch failed: RuntimeError: forced failure" in line[0]
    assert "verify: OK" not in proc.stdout


def test_a_missing_sglang_sync_writer_is_cannot_run():
    code = (
        "import sys\n"
        "from sglang.srt.managers.scheduler_components import dp_attn\n"
        "del dp_attn._update_gather_batch\n"
        + CLI.format(argv=["verify", "--steps", "5", "--dp", "2", "--no-progress"])
    )
    proc = run_python(code)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-2000:]
    assert "cannot drive SGLang's DP sync path" in proc.stderr
