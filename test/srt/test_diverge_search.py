"""``diverge``'s search on the installed SGLang (the full releases' suite):
stock, hypothesis finds and shrinks every known defect of the build, each as
its own finding naming its upstream change, and nothing else; with the
plugin, no divergence in the searched schedules and in at least 2,000 soak
steps per rank count (2, 4 and 8 ranks)."""

from __future__ import annotations

import json

import pytest
from known_releases import FOLDED, backport_fixes, known
from srt_helpers import cli, no_children_left

from sglang_dspark_dp.harness import diverge

HANG_S = 2.0
SOAK_STEPS = 2000
#: Runs each of the plugin's six searches makes (none diverges: every
#: search spends them all; the soak is the long run).
PLUGIN_EXAMPLES = 6
#: Runs a stock search makes before it gives up (the CLI's default is 40;
#: each known defect was found within 14 generated runs on 0.5.16-0.5.23;
#: the search after the last finding spends all of them).
STOCK_EXAMPLES = 16


def expected_findings(row, version: str) -> set[tuple[str, str]]:
    """``(site, change)`` of every defect the recorded behaviour says the
    build has, as the search must find them on 4 ranks of both layouts."""
    out = set()
    if row["dp"]:
        out.add(("draft", "dp-draft-metadata"))
    if row["startup_dp"]:
        out.add(("capture", "capture-group-memory"))
        if FOLDED[version]:
            out.add(("folded", "capture-group-memory"))
    if row["startup_tp"]:
        out.add(("capture", "spec-tp-sync"))
        if FOLDED[version]:
            out.add(("folded", "spec-tp-sync"))
    if row["compact_verify"]:
        out.add(("verify-tier", "verify-budget-broadcast"))
    if row["late_relay"]:
        out.add(("verify-lens", "relay-wait"))
    if row["non_overlap"]:
        out.add(("entry", "non-overlap-pp-proxy"))
    return out


@pytest.fixture(scope="module")
def row(sglang_version):
    found = known(sglang_version)
    if found is None:
        pytest.fail(f"sglang {sglang_version} has no row in known_releases.py")
    return found


@pytest.fixture(scope="module")
def stock_search(plugin, tmp_path_factory):
    """``diverge --no-fix --ranks 4`` (both layouts), as a user runs it."""
    proc = cli(
        [
            "diverge",
            "--no-fix",
            "--ranks",
            "4",
            "--hang",
            str(HANG_S),
            "--examples",
            str(STOCK_EXAMPLES),
            "--json",
        ]
    )
    assert proc.returncode in (0, 1), proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)


def test_stock_search_rediscovers_each_known_defect(stock_search, row, sglang_version):
    code, report = stock_search
    want = expected_findings(row, sglang_version)
    got = [(f["site"], f["change"]) for f in report["findings"]]
    assert len(got) == len(set(got)), got  # each its own finding
    assert set(got) == want, json.dumps(report["findings"], indent=1)[:4000]
    assert code == (1 if want else 0)
    for f in report["findings"]:
        assert f["reproduced"], f  # its replay line plays it again
        assert f["replay"] and f["title"]


def test_stock_findings_are_shrunk(stock_search):
    """Each finding's schedule drives only what it needs: one code path
    (the crash and the entry need no perturbation; the startup ones only
    memory; the verify ones only their perturbation)."""
    _, report = stock_search
    for f in report["findings"]:
        sched = diverge.Schedule.parse(f["replay"])
        assert len(sched.sites) == 1, f["replay"]
        causes = " ".join(f["perturbations"])
        if f["site"] in ("capture", "folded"):
            assert sched.sites == ("startup",) and "free memory" in causes
            assert sum(g != 40.0 for g in sched.free) == 1, f["replay"]
        if f["site"] == "verify-tier":
            assert "confidence noise" in causes
        if f["site"] == "verify-lens":
            assert "late" in causes
        if f["site"] == "draft":
            assert sched.sites == ("draft",)
        if f["site"] == "entry":
            assert "overlap schedule off" in causes


def test_a_search_looks_past_what_is_known(stock_search, row, sglang_version):
    """Told the stock search's first finding, a search with nothing masked
    (the finding's consequence still reachable) returns another known defect
    of the build or none, never the one it was told."""
    _, report = stock_search
    if not report["findings"]:
        pytest.skip(f"sglang {sglang_version}: no stock finding to be told")
    first = report["findings"][0]
    told = frozenset({(first["site"], first["change"])})
    layout = diverge.Schedule.parse(first["replay"]).layout
    again = diverge.search(
        layout, 4, fix=False, examples=STOCK_EXAMPLES, hang_s=HANG_S, known=told
    )
    if again.finding is not None:
        got = (again.finding.site, again.finding.change)
        assert got not in told, again.finding.as_dict()
        assert got in expected_findings(row, sglang_version) - told, got


def test_with_the_plugin_no_rank_count_diverges(plugin, sglang_version):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = cli(
        [
            "diverge",
            "--ranks",
            "2,4,8",
            "--examples",
            str(PLUGIN_EXAMPLES),
            "--hang",
            "3",
            "--soak-steps",
            str(SOAK_STEPS),
            "--json",
        ]
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["findings"] == []
    per_count: dict[int, int] = {}
    for soak in report["soak"]:
        assert soak["complete"] and not soak["diverged"], soak
        n = diverge.Schedule.parse(soak["schedule"]).world
        per_count[n] = per_count.get(n, 0) + soak["steps"]
    assert per_count == {2: SOAK_STEPS, 4: SOAK_STEPS, 8: SOAK_STEPS}
    searched = {(s["layout"], s["world"]) for s in report["searches"]}
    assert searched == {(lay, n) for lay in ("dp", "tp") for n in (2, 4, 8)}
    assert no_children_left()


def test_a_search_with_the_watch_finds_the_capture_decision_by_it(row):
    """``diverge --watch`` searches too: every generated run has the watch
    on, so the stock startup disagreement a search finds (everything but
    the capture decision masked) says ``detector: watch``."""
    layout = "tp" if row["startup_tp"] else "dp"
    if not row[f"startup_{layout}"]:
        pytest.skip("this build reduces the startup reading in both layouts")
    # Everything masked but the capture decision's consequence and the
    # perturbation that reaches it (the free-memory reading).
    keep = ("capture", "memory")
    others = frozenset(m for site, m in diverge.MASK_OF.items() if site not in keep)
    with diverge.repairs_as(False):
        found = diverge.search(
            layout,
            2,
            fix=False,
            masks=others,
            examples=14,
            shrink_runs=0,
            max_steps=1,
            hang_s=HANG_S,
            watch=True,
        )
    f = found.finding
    assert f is not None and f.site == "capture", found
    assert f.detector == "watch", f.as_dict()
    assert "the draft CUDA-graph capture decision at startup" in f.watch, f.watch
