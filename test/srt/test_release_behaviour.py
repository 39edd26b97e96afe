"""What the installed release needs, and that the plugin applies there.

Every release in CI runs this file, whether it gets the full suite or not:
the probes find exactly the recorded behaviour (``known_releases``), in
upstream changes, each judged by exactly one repair; every repair the
release needs is enabled (a probe that cannot run where it is needed fails
here, naming the repair, the release and the error, instead of switching
the repair off with a log line); ``doctor`` is healthy and names the same
changes; a short ``verify`` exits 0 with the plugin and names each stock
divergence with ``--no-fix``.
"""

from __future__ import annotations

import json

import pytest
from known_releases import backport_fixes, known, needs
from srt_helpers import cli

from sglang_dspark_dp import registry
from sglang_dspark_dp.outcome import Outcome


def recorded(version):
    row = known(version)
    if row is None:
        pytest.fail(
            f"sglang {version} has no row in known_releases.py: measure it "
            "(nox -s compat) and record it"
        )
    return row


def test_draft_probe_matches_the_recorded_behaviour(plugin, sglang_version):
    row = recorded(sglang_version)
    found = plugin.probe_result
    assert bool(found.missing_dp) is row["dp"], found.missing_dp
    assert bool(found.missing_local) is row["local"], found.missing_local
    if row["blocks"] is not None:
        assert bool(found.blocking) is row["blocks"], found.blocking
    assert plugin.instrumented is (
        needs(sglang_version)["draft-batch"] and not backport_fixes()
    )


def test_the_repairs_judge_every_change_as_recorded(plugin, sglang_version):
    """Each upstream change is judged by exactly one repair's probe, and
    the states are the recorded ones (backport mode: with the named changes
    in place)."""
    row = recorded(sglang_version)
    found: dict[str, list[tuple[str, str]]] = {}
    for name in registry.names():
        repair = registry.repair(name)
        verdicts = repair.verdicts if not backport_fixes() else repair.stock_verdicts()
        for v in verdicts:
            assert v.key in repair.stands_in_for, (name, v.key)
            found.setdefault(v.key, []).append((name, v.state.value))
    doubled = {k: v for k, v in found.items() if len(v) != 1}
    assert not doubled, doubled
    got = {k: v[0][1] for k, v in found.items()}
    want = {k: s.value for k, s in row["changes"].items()}
    assert got == want


def test_every_repair_applies_where_the_release_needs_it(plugin, sglang_version):
    """A repair the release needs must be enabled; 'not applicable' there is
    a failure of this suite, not a log line."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    wanted = needs(sglang_version)
    if wanted is None:
        pytest.fail(f"sglang {sglang_version} has no row in known_releases.py")
    problems = []
    for name in registry.names():
        status = registry.repair(name).status()
        expect = Outcome.ENABLED if wanted.get(name, False) else Outcome.NOT_NEEDED
        if status.outcome is not expect:
            problems.append(
                f"repair {name} on sglang {sglang_version}: expected "
                f"{expect.value}, got {status.outcome.value}: {status.reason}"
            )
    assert not problems, "\n".join(problems)


def test_doctor_is_healthy(plugin, sglang_version):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = cli(["doctor", "--json"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert {r["repair"] for r in report["repairs"]} == set(registry.names())
    for r in report["repairs"]:
        assert r["outcome"] in ("enabled", "not needed"), r
    row = known(sglang_version)
    assert {c["change"]: c["state"] for c in report["changes"]} == {
        k: s.value for k, s in row["changes"].items()
    }


def test_short_verify_passes_with_the_plugin(plugin, short_verify):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = short_verify["fixed"]
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "verify: OK" in proc.stdout
    startup = [x for x in proc.stdout.splitlines() if x.startswith("startup:")]
    assert len(startup) == 2 and all("all 2 ranks skipped" in x for x in startup)
    tiers = [x for x in proc.stdout.splitlines() if x.startswith("compact-verify:")]
    assert len(tiers) == 2 and all("agreed" in x for x in tiers), tiers
    (state,) = [x for x in proc.stdout.splitlines() if x.startswith("process-state:")]
    assert "repair verdicts match a fresh process's" in state, state
    assert "all 2 ranks skipped" in state, state


def test_short_verify_names_each_stock_divergence(plugin, sglang_version, short_verify):
    row = recorded(sglang_version)
    proc = short_verify["stock"]
    out = proc.stdout
    diverges = any(
        row[k]
        for k in ("dp", "startup_tp", "startup_dp", "non_overlap", "compact_verify")
    )
    assert proc.returncode == (1 if diverges else 0), out + proc.stderr[-2000:]
    assert "Traceback" not in out + proc.stderr
    startup = {
        "TP 2, DP attention": next(
            x for x in out.splitlines() if x.startswith("startup: TP 2, DP attention")
        ),
        "TP 2": next(
            x for x in out.splitlines() if x.startswith("startup: TP 2, stock")
        ),
    }
    assert ("hang" in startup["TP 2"]) is row["startup_tp"], startup["TP 2"]
    assert ("hang" in startup["TP 2, DP attention"]) is row["startup_dp"]
    assert ("stock DSpark crashes under DP attention" in out) is row["dp"]
    entry = next(x for x in out.splitlines() if x.startswith("non-overlap:"))
    assert ("every step crashes" in entry) is row["non_overlap"], entry
    drift, late = (
        next(x for x in out.splitlines() if x.startswith(f"compact-verify: {what}"))
        for what in ("TP 2, compact, confidence drift", "TP 2, compact, rank 1 late")
    )
    assert ("diverged" in drift) is row["compact_verify"], drift
    assert ("left out" in late) is (row["late_relay"] and row["compact_verify"]), late
    assert "process-state: skipped (--no-fix" in out
