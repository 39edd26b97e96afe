"""The ``sglang-dspark-dp`` command: verify, doctor, each in a fresh
interpreter, with its exit codes and its one-line errors."""

from __future__ import annotations

import pytest
from known_releases import FOLDED, backport_fixes, known
from srt_helpers import CLI, SHORT_VERIFY, cli, run_python


def test_cli_verify_exit_codes(plugin, sglang_version, short_verify):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    ok = short_verify["fixed"]
    assert ok.returncode == 0, ok.stdout + ok.stderr[-2000:]
    assert "verify: OK" in ok.stdout
    assert "graph-size tier" in ok.stdout and "ranks agree" in ok.stdout
    bad = cli(["verify", "--dp", "0"])
    assert bad.returncode == 2 and "--dp must be between 2 and 16, got 0" in bad.stderr
    if (known(sglang_version) or {}).get("dp"):
        nofix = short_verify["stock"]
        assert nofix.returncode == 1, nofix.stdout + nofix.stderr[-2000:]
        assert "stock DSpark crashes under DP attention" in nofix.stdout
        assert "Traceback" not in nofix.stdout + nofix.stderr


@pytest.mark.parametrize(
    ("field", "says"),
    [
        ("padded_tokens", "ranks disagree on padded_tokens"),
        ("non_padded_cpu", "EP accounting: non-padded sum"),
    ],
)
def test_cli_verify_fails_naming_the_one_field_a_rank_gets_wrong(plugin, field, says):
    """``verify`` as the user runs it, with the harness made (its test hook,
    ``SGLANG_DSPARK_DP_FAULT``) to give rank 1 one field one off at step 5
    of the EP-on tier: exit 1, a FAILED line naming the field, the step,
    the tier, and no OK line."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    from sglang_dspark_dp.harness.lockstep import FAULT_ENV

    argv = ["verify", "--steps", "12", "--dp", "2", "--no-progress", "--no-startup"]
    proc = cli(argv, **{FAULT_ENV: f"skew:1:2:5:{field}"})
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    failed = [x for x in proc.stdout.splitlines() if x.startswith("verify: FAILED")]
    assert len(failed) == 1, proc.stdout[-3000:]
    assert "at step 5 (EP 2" in failed[0] and says in failed[0], failed[0]
    assert "verify: OK" not in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_cli_repro_shows_stock_and_the_repair_side_by_side(plugin, sglang_version):
    """``repro``: one DP step, stock then repaired, each rank's DP fields;
    exit 0 when the repaired step runs. Where the release's stock crashes
    under DP attention, stock's ranks say so and the repaired ranks carry
    the raw per-rank counts."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = cli(["repro", "--dp", "2"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    stock, fixed = proc.stdout.split("--- with sglang-dspark-dp")
    assert "--- stock SGLang (no plugin)" in stock
    for rank, path in ((0, "busy"), (1, "idle")):
        assert f"rank {rank} ({path}): graph=yes" in fixed, fixed
    assert fixed.count("original_global_num_tokens_cpu=[3, 0]") == 2, fixed
    if (known(sglang_version) or {}).get("dp"):
        assert stock.count("CRASH in can_run_graph: TypeError") == 2, stock
        assert "stock: crashes; with the plugin: ok" in proc.stdout
    else:
        assert "stock: ok; with the plugin: ok" in proc.stdout


def test_cli_doctor_json(plugin, sglang_version):
    import json

    proc = cli(["doctor", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["dspark_present"] is True
    assert report["entry_point_registered"] is True
    assert report["plugin_loaded"] is True
    assert report["bug_detected"] is plugin.probe_result.affected
    assert report["repair_applied"] is plugin.plan.patches
    assert report["guard"] is False
    assert report["watch"]["on"] is False and report["watch"]["mode"] == "exit"
    guarded = cli(
        ["doctor", "--json"],
        SGLANG_DSPARK_DP_CHECK="1",
        SGLANG_ENABLE_RANK_CONSENSUS_CHECKER="1",
        SGLANG_DSPARK_DP_WATCH="log",
    )
    assert guarded.returncode == 0, guarded.stderr[-2000:]
    watched = json.loads(guarded.stdout)
    assert watched["guard"] is True
    assert watched["watch"]["on"] is True and watched["watch"]["mode"] == "log"
    sites = {s["site"]: s for s in watched["watch"]["sites"]}
    # Every release's worker takes the startup capture decision; the
    # folded-sampling one only where its draft sampler decides it.
    assert sites["startup"]["watchable"] is True, sites
    folded = known(sglang_version) and FOLDED[sglang_version]
    assert sites["startup"]["decisions"] == [
        "draft CUDA-graph capture",
        *(["folded-sampling"] if folded else []),
    ]
    entry = sites["worker-entry"]
    assert entry["watchable"] is True, entry
    assert entry["decisions"] == ["worker step entry"]
    verify = sites["compact-verify"]
    assert verify["decisions"] and (verify["watchable"] or verify["reason"]), verify
    draft = sites["draft-batch"]
    assert draft["watchable"] is True, draft
    assert draft["decisions"] == ["draft DP sync sizes", "draft graph admission"]


def test_cli_doctor_names_a_bad_watch_mode_and_keeps_exit(plugin):
    """An unknown ``SGLANG_DSPARK_DP_WATCH``: one line naming the variable
    and the value; the watch stays in its default mode; doctor's verdict
    does not change."""
    import json

    proc = cli(
        ["doctor"],
        SGLANG_ENABLE_RANK_CONSENSUS_CHECKER="1",
        SGLANG_DSPARK_DP_WATCH="loud",
    )
    assert "SGLANG_DSPARK_DP_WATCH='loud' is not one of exit/log" in proc.stderr
    rows = [x.split() for x in proc.stdout.splitlines()]
    assert ["watch", "(SGLANG_ENABLE_RANK_CONSENSUS_CHECKER)", "on", "(exit)"] in rows
    assert "  watch site startup" in proc.stdout
    assert "Traceback" not in proc.stderr
    plain = cli(["doctor", "--json"])
    assert proc.returncode == plain.returncode
    assert json.loads(plain.stdout)["watch"]["sites"]


def doctor_outcomes(proc) -> dict[str, str]:
    import json

    return {s["repair"]: s["outcome"] for s in json.loads(proc.stdout)["repairs"]}


def test_cli_doctor_exits_0_where_every_repair_is_enabled_or_not_needed(plugin):
    """The installed build as it is: each release has a repair it needs
    (enabled) and one it does not (not needed), and nothing else."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = cli(["doctor", "--json"])
    outcomes = doctor_outcomes(proc)
    assert set(outcomes.values()) == {"enabled", "not needed"}, outcomes
    assert proc.returncode == 0, proc.stderr[-2000:]


#: The DSpark planner module, hidden: the verify-budget repair's probe
#: cannot drive it, and the repair cannot be set up.
NO_PLANNER = (
    "import sys\n"
    "sys.modules['sglang.srt.speculative.dspark_components.dspark_planner'] = None\n"
)


def test_cli_doctor_exits_1_when_a_repair_is_not_applicable(plugin):
    """A repair that cannot be set up on a build that needs it (every
    release needs verify-budget) is not healthy, whatever the others say."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = run_python(NO_PLANNER + CLI.format(argv=["doctor", "--json"]))
    outcomes = doctor_outcomes(proc)
    assert outcomes["verify-budget"] == "not applicable", outcomes
    assert "enabled" in outcomes.values()  # the others still set up
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr


def test_cli_doctor_exits_1_when_a_repair_is_not_instrumented(plugin):
    """One repair taken off after the load (the others stay on), and the
    whole plugin left out by SGLang's whitelist: not healthy, exit 1."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    code = (
        "from sglang.srt.plugins import load_plugins\n"
        "from sglang_dspark_dp import registry\n"
        "load_plugins()\n"
        "registry.repair('relay-wait').uninstrument()\n"
    )
    proc = run_python(code + CLI.format(argv=["doctor", "--json"]))
    outcomes = doctor_outcomes(proc)
    assert outcomes["relay-wait"] == "not instrumented", outcomes
    assert "enabled" in outcomes.values()
    assert proc.returncode == 1
    left_out = cli(["doctor", "--json"], SGLANG_PLUGINS="some_other_plugin")
    outcomes = doctor_outcomes(left_out)
    assert set(outcomes.values()) == {"not instrumented"}, outcomes
    assert left_out.returncode == 1
    assert "does not list dspark_dp" in left_out.stdout


def test_cli_doctor_without_dspark():
    """No DSpark at all: exit 2, whatever the repairs would say."""
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


def test_plugin_and_doctor_need_no_benchmark_dependencies(plugin):
    """A serving environment without matplotlib (the benchmarks' dependency)
    still loads the plugin and runs ``doctor``."""
    code = "import sys\nsys.modules['matplotlib'] = None\n" + CLI.format(
        argv=["doctor"]
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "repair draft-batch" in proc.stdout


def test_verify_startup_phase_shows_the_stock_divergence_and_the_fix(
    plugin, short_verify
):
    """``verify --no-fix`` names the diverging ranks and what each read, and
    exits 1, on every release (DP attention diverges on all of them);
    with the plugin every rank decides the same; ``--no-startup`` skips it."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    stock = short_verify["stock"]
    assert stock.returncode == 1, stock.stdout + stock.stderr[-2000:]
    lines = [x for x in stock.stdout.splitlines() if x.startswith("startup:")]
    assert any("DP attention" in x and "rank 1 read 0.60 GiB" in x for x in lines)
    assert "readings (" in stock.stdout
    fixed = short_verify["fixed"]
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr[-2000:]
    lines = [x for x in fixed.stdout.splitlines() if x.startswith("startup:")]
    assert len(lines) == 2 and all("all 2 ranks skipped" in x for x in lines)
    skipped = cli([*SHORT_VERIFY, "--no-startup"])
    assert skipped.returncode == 0
    assert not any(x.startswith("startup:") for x in skipped.stdout.splitlines())
