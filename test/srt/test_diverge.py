"""``diverge`` on the installed SGLang, short runs every release gets: each
known defect's schedule, played stock, is one finding naming its upstream
change (and none where the build carries the change); with the plugin the
same schedules agree at every step; the recorder's dumps are what
``torch.distributed.flight_recorder`` reads and what ``--explain`` names;
bad input is one line and exit 2."""

from __future__ import annotations

import json
import os

import pytest
from known_releases import FOLDED, backport_fixes, known
from srt_helpers import cli, no_children_left

from sglang_dspark_dp.harness import diverge, flight

#: One schedule per known defect, the change it belongs to and the site it
#: shows at, and when the installed build has that defect
#: (``known_releases``' behaviour, ``folded``: the release decides folded
#: sampling from free memory). World 4: the second TP group starts at rank 2.
DEFECTS = {
    "draft-crash": (
        "layout=dp;world=4;steps=2;sites=draft",
        "dp-draft-metadata",
        "draft",
        lambda row, v: row["dp"],
    ),
    "capture-dp": (
        "layout=dp;world=4;steps=1;free=40,40,0.6,40;sites=startup",
        "capture-group-memory",
        "capture",
        lambda row, v: row["startup_dp"],
    ),
    "capture-tp": (
        "layout=tp;world=4;steps=1;free=40,40,40,0.6;sites=startup",
        "spec-tp-sync",
        "capture",
        lambda row, v: row["startup_tp"],
    ),
    "folded-dp": (
        "layout=dp;world=4;steps=1;free=40,1.5,40,40;sites=startup",
        "capture-group-memory",
        "folded",
        lambda row, v: row["startup_dp"] and FOLDED[v],
    ),
    "folded-tp": (
        "layout=tp;world=4;steps=1;free=40,40,1.5,40;sites=startup",
        "spec-tp-sync",
        "folded",
        lambda row, v: row["startup_tp"] and FOLDED[v],
    ),
    "tier-flip": (
        "layout=tp;world=4;steps=6;seed=0;noise=0.001;sites=verify",
        "verify-budget-broadcast",
        "verify-tier",
        lambda row, v: row["compact_verify"],
    ),
    "late-relay": (
        "layout=tp;world=4;steps=6;seed=5;late=0.5;sites=verify",
        "relay-wait",
        "verify-lens",
        lambda row, v: row["late_relay"],
    ),
    "non-overlap": (
        "layout=dp;world=4;steps=2;overlap=off;sites=entry",
        "non-overlap-pp-proxy",
        "entry",
        lambda row, v: row["non_overlap"],
    ),
}

HANG_S = 2.0


@pytest.fixture(scope="module")
def row(sglang_version):
    found = known(sglang_version)
    if found is None:
        pytest.fail(f"sglang {sglang_version} has no row in known_releases.py")
    return found


@pytest.fixture(scope="module")
def stock_runs(plugin):
    """Every defect's schedule, played stock (plugin off) once."""
    with diverge.repairs_as(False):
        return {
            name: diverge.run(diverge.Schedule.parse(text), fix=False, hang_s=HANG_S)
            for name, (text, *_) in DEFECTS.items()
        }


@pytest.mark.parametrize("name", list(DEFECTS))
def test_stock_shows_each_known_defect_as_its_change(
    name, stock_runs, row, sglang_version
):
    _, change, site, present = DEFECTS[name]
    out = stock_runs[name]
    if not present(row, sglang_version):
        assert out.finding is None, out.finding.as_dict()
        assert out.complete, out.errors
        return
    f = out.finding
    assert f is not None, (out.errors, out.steps_done)
    assert (f.change, f.site) == (change, site), f.as_dict()
    assert not any(e.get("kind") == "hung" for e in out.errors.values()), out.errors
    assert no_children_left()


@pytest.mark.parametrize("name", list(DEFECTS))
def test_with_the_plugin_each_schedule_agrees(name, plugin, row, sglang_version):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    text = DEFECTS[name][0]
    with diverge.repairs_as(True):
        out = diverge.run(diverge.Schedule.parse(text), fix=True, hang_s=HANG_S)
    assert out.finding is None, out.finding.as_dict()
    assert out.complete, out.errors


def test_a_capture_disagreement_is_found_by_the_recorder(stock_runs, row):
    """The startup disagreement is the flight recorder's: the ranks that
    capture wait in a barrier the short rank never enters, each named with
    its SGLang call site and its decision inputs."""
    if not row["startup_dp"]:
        pytest.skip("this build reduces the startup reading under DP attention")
    out = stock_runs["capture-dp"]
    m = out.mismatch
    assert m is not None and m.kind == flight.MISSING, m
    assert [r for r, e in m.entries.items() if e is None] == [2]
    assert {e.op for e in m.present()} == {"gloo:barrier"}
    f = out.finding
    assert f.step is None  # at startup
    assert "init_cuda_graphs" in f.call_sites[0]
    assert f.inputs[2]["free_gib"] == 0.6 and f.inputs[2]["captured"] is False
    assert f.inputs[0]["captured"] is True
    assert "free memory around the capture cutoff (rank 2 0.6 GiB)" in (
        f.schedule.perturbations()
    )


def test_with_the_watch_the_capture_decision_is_named_before_the_barrier(row):
    """``diverge --replay --watch``: the stock startup disagreement is found
    by the watch (its line names the capture decision at startup, every
    rank's value and the change), before the barrier the flight recorder
    sees; with the plugin the watch says nothing and nothing diverges."""
    if not row["startup_dp"]:
        pytest.skip("this build reduces the startup reading under DP attention")
    sched = diverge.Schedule.parse(DEFECTS["capture-dp"][0])
    with diverge.repairs_as(False):
        out = diverge.run(sched, fix=False, hang_s=HANG_S, watch=True)
    f = out.finding
    assert f is not None and f.site == "capture", out
    found = f.as_dict()
    assert found["detector"] == "watch", found
    line = found["watch"]
    assert "part ways on the draft CUDA-graph capture decision at startup" in line
    assert "rank 2: capture=False" in line and "rank 0: capture=True" in line, line
    assert "capture-group-memory" in line or "#39954" in line, line
    with diverge.repairs_as(True):
        fixed = diverge.run(sched, fix=True, hang_s=HANG_S, watch=True)
    assert fixed.finding is None and fixed.alarms == {}, fixed.alarms
    assert fixed.complete


def test_without_the_watch_a_finding_is_the_recorders(stock_runs, row):
    if not row["startup_dp"]:
        pytest.skip("this build reduces the startup reading under DP attention")
    found = stock_runs["capture-dp"].finding.as_dict()
    assert found["detector"] == "flight recorder" and found["watch"] == ""


def test_the_first_divergence_is_the_programs_not_the_clocks(tmp_path, plugin, row):
    """The short rank skips the capture barrier and waits in the next step's
    sync, which the others never reach: two groups part. Whichever rank's
    process the machine ran first, the divergence is the capture (startup
    comes before step 0), even where the step sync's clock is the earlier."""
    if not row["startup_dp"]:
        pytest.skip("this build reduces the startup reading under DP attention")
    import dataclasses

    sched = diverge.Schedule.parse(DEFECTS["capture-dp"][0])
    with diverge.repairs_as(False):
        diverge.run(sched, fix=False, hang_s=HANG_S, dump_dir=str(tmp_path))
    dumps = flight.load_dir(str(tmp_path))
    sidecars = diverge.load_sidecars(str(tmp_path))
    assert any(diverge.site_of(e) == "step-sync" for e in dumps[2].entries)
    for d in dumps.values():  # the step sync's clock first
        d.entries[:] = [
            dataclasses.replace(
                e, created_ns=e.created_ns if d.rank != 2 else e.created_ns % 1000
            )
            for e in d.entries
        ]
    mismatch, finding = diverge.explain(dumps, sidecars, sched)
    assert finding.site == "capture", finding.as_dict()
    assert [r for r, e in mismatch.entries.items() if e is None] == [2]


def test_a_tier_flip_is_two_sizes_of_one_collective(stock_runs, row):
    if not row["compact_verify"]:
        pytest.skip("this build broadcasts the verify budget")
    out = stock_runs["tier-flip"]
    m = out.mismatch
    assert m is not None and m.kind == flight.SIZES
    sizes = {e.input_sizes for e in m.present()}
    assert len(sizes) == 2
    tiers = {r: out.finding.inputs[r]["tier"] for r in m.ranks}
    assert len(set(tiers.values())) == 2, tiers
    # the recorded size is the tier each rank picked
    assert {e.input_sizes[0][0] for e in m.present()} == set(tiers.values())


def test_the_recorder_keeps_each_ranks_decision(tmp_path, plugin):
    """With the plugin every rank agrees; the draft forward's DP gather each
    rank entered carries its padded token count, step by step, as the
    recorder kept it (the sidecar holds the decision)."""
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    dumps = tmp_path / "draft"
    text = "layout=dp;world=4;steps=6;seed=3;idle=0.3;sites=draft"
    with diverge.repairs_as(True):
        out = diverge.run(
            diverge.Schedule.parse(text), fix=True, hang_s=HANG_S, dump_dir=str(dumps)
        )
    assert out.finding is None and out.complete, out.errors
    recorded = flight.load_dir(str(dumps))
    sidecars = diverge.load_sidecars(str(dumps))
    padded = {r: [s["padded"] for s in side["steps"]] for r, side in sidecars.items()}
    assert len({tuple(p) for p in padded.values()}) == 1  # the ranks agree
    assert len(set(padded[0])) > 1  # and the count moves with the requests
    for rank, dump in recorded.items():
        gathers = [e for e in dump.entries if diverge.site_of(e) == "draft"]
        assert [e.input_sizes[0][0] for e in gathers] == padded[rank]


def test_replay_dumps_are_read_by_torch_and_explained(tmp_path, plugin, row):
    """A diverging replay keeps its dumps; PyTorch's own reader reads them
    (one file per rank), and ``--explain`` names the site and the change,
    with this tool's sidecars and without (a real server's dumps)."""
    if not row["startup_dp"]:
        pytest.skip("no startup disagreement under DP attention in this build")
    text = DEFECTS["capture-dp"][0]
    dumps = tmp_path / "dumps"
    proc = cli(
        [
            "diverge",
            "--no-fix",
            "--hang",
            str(HANG_S),
            "--replay",
            text,
            "--dump-dir",
            str(dumps),
            "--json",
        ]
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["finding"]["change"] == "capture-group-memory"
    names = sorted(os.listdir(dumps))
    assert [n for n in names if n.startswith(flight.PREFIX)] == [
        f"{flight.PREFIX}{r}" for r in range(4)
    ]
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    details, _ = read_dir(JobConfig().parse_args([str(dumps)]))
    assert len(details) == 4
    assert all(d["entries"] for d in details.values())

    explained = cli(["diverge", "--explain", str(dumps)])
    assert explained.returncode == 1, explained.stdout + explained.stderr[-2000:]
    assert "#39954 capture-group-memory" in explained.stdout
    assert "with this tool's decision sidecars" in explained.stdout
    assert "free_gib=0.6" in explained.stdout

    bare = tmp_path / "bare"
    bare.mkdir()
    for n in names:
        if n.startswith(flight.PREFIX):
            (bare / n).write_bytes((dumps / n).read_bytes())
    alone = cli(["diverge", "--explain", str(bare), "--json"])
    assert alone.returncode == 1, alone.stdout + alone.stderr[-2000:]
    found = json.loads(alone.stdout)["finding"]
    # Without the sidecars the world group is the one every rank is known
    # to be in: the short rank went on to the next step's sync, the others
    # never came, waiting in the capture barrier.
    assert found["site"] == "capture"
    assert found["change"] == "capture-group-memory"
    assert "under plain TP it is #33614 spec-tp-sync" in found["detail"]
    for r in ("0", "1", "3"):
        assert "never entered it (last: gloo:barrier" in found["ranks"][r]
        assert "init_cuda_graphs" in found["call_sites"][r]
    assert "step-sync" in found["ranks"]["2"]


def test_explain_of_agreeing_dumps_finds_nothing(tmp_path, plugin):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    dumps = tmp_path / "ok"
    with diverge.repairs_as(True):
        out = diverge.run(
            diverge.Schedule.parse(DEFECTS["capture-dp"][0]),
            fix=True,
            hang_s=HANG_S,
            dump_dir=str(dumps),
        )
    assert out.finding is None and out.complete
    proc = cli(["diverge", "--explain", str(dumps)])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "no mismatch" in proc.stdout


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--ranks", "3"], "--ranks takes 2, 4, 8 (comma-separated), got '3'"),
        (["--layouts", "ep"], "--layouts takes dp, tp (comma-separated), got 'ep'"),
        (["--hang", "0"], "--hang must be a positive number of seconds, got '0'"),
        (
            ["--replay", "layout=dp;world=3;steps=1"],
            "world must be one of 2, 4, 8, got 3",
        ),
        (
            ["--replay", "layout=dp;world=4;steps=1;free=1,2"],
            "free must give one value per rank (4), got 2: 1.0,2.0",
        ),
        (
            ["--replay", "layout=tp;world=4;steps=1;sites=draft"],
            "sites must name each of startup, entry, verify at most once for "
            "layout tp, got 'draft'",
        ),
        (
            ["--replay", "layout=dp;world=4;steps=x"],
            "steps must be an integer, got 'x'",
        ),
        (
            ["--replay", "layout=dp;world=4;steps=1;colour=red"],
            "unknown schedule field 'colour'",
        ),
        (
            ["--explain", "/nonexistent/dir"],
            "DUMP_DIR '/nonexistent/dir' is not a folder",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(argv, message):
    proc = cli(["diverge", *argv])
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_explain_of_a_folder_without_dumps(tmp_path):
    (tmp_path / "notes_1").write_text("not a dump")
    proc = cli(["diverge", "--explain", str(tmp_path)])
    assert proc.returncode == 2
    assert "notes_1: not a flight-recorder dump" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_schedule_replay_line_round_trips():
    s = diverge.Schedule(
        layout="tp",
        world=8,
        steps=7,
        seed=3,
        overlap=False,
        free=(40.0,) * 7 + (0.6,),
        noise=0.001,
        late=0.5,
        idle=0.3,
        sites=("startup", "verify"),
    )
    assert diverge.Schedule.parse(s.replay()) == s
    assert diverge.Schedule.parse(diverge.Schedule("dp", 2, 1).replay()) == (
        diverge.Schedule("dp", 2, 1)
    )
