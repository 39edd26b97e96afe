"""CPU checks of the overlap-loop benchmark (``bench_overlap.py``).

Without CUDA the script refuses in one line and exits 2, whatever the
arguments. Its pure pieces (grid parsing, the step plan, the deployment
marks, the targets, the table) and the loop's order (with a recording
stand-in for the device and no waiting) are checked here; so is the
wiring of the real fills on the installed SGLang, on CPU. No timing is
asserted: the figures come from the GPU run, in RESULTS.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark_dp_bench.draft_metadata import bench_overlap as bo

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmark" / "draft_metadata" / "bench_overlap.py"


def _cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


@pytest.mark.skipif(_cuda(), reason="this machine has CUDA: nothing to refuse")
@pytest.mark.parametrize(
    "argv",
    [[], ["--steps", "2"], ["compare", "--site", "0.5.17=/nonexistent"]],
)
def test_refuses_without_cuda_in_one_line(argv):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "CUDA" in lines[0] and "nothing was run" in lines[0]


def test_help_works_without_cuda():
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert "--gpu-ms" in proc.stdout and "--host-ms" in proc.stdout


def test_parse_ms_list():
    assert bo.parse_ms_list("2,5,10,20") == (2.0, 5.0, 10.0, 20.0)
    assert bo.parse_ms_list("0.05 0.3, 1,3") == (0.05, 0.3, 1.0, 3.0)
    assert bo.parse_ms_list(["2", "5,10"]) == (2.0, 5.0, 10.0)
    for bad in ("", "0", "-1", "x", "1,,nan", "inf"):
        with pytest.raises(ValueError):
            bo.parse_ms_list(bad)


def test_parse_parts():
    weights = bo.parse_parts(None)
    assert weights == dict.fromkeys(bo.HOST_PARTS, 1.0)
    weights = bo.parse_parts("schedule=2,plan=0")
    assert weights["schedule"] == 2.0 and weights["plan"] == 0.0
    assert weights["result"] == 1.0
    for bad in ("nope=1", "schedule", "plan=x", "plan=-1"):
        with pytest.raises(ValueError):
            bo.parse_parts(bad)


def test_cli_rejects_a_bad_grid():
    with pytest.raises(SystemExit):
        bo.build_parser().parse_args(["--gpu-ms", "2,x"])
    args = bo.build_parser().parse_args(["--gpu-ms", "2,5", "--host-ms", "0.05,3"])
    assert args.gpu_ms == (2.0, 5.0) and args.host_ms == (0.05, 3.0)


def test_default_grid_covers_the_issue_ranges_and_marks_deployment_cells():
    plans = bo.grid(bo.DEFAULT_GPU_MS, bo.DEFAULT_HOST_MS, bo.parse_parts(None), 0.2)
    assert len(plans) == len(bo.DEFAULT_GPU_MS) * len(bo.DEFAULT_HOST_MS)
    assert min(p.gpu_ms for p in plans) == 2 and max(p.gpu_ms for p in plans) == 20
    assert min(p.host_ms for p in plans) == 0.05
    assert max(p.host_ms for p in plans) == 3
    marked = {(p.gpu_ms, p.host_ms) for p in plans if p.deployment}
    assert marked == {(10.0, 0.3), (10.0, 1.0), (20.0, 0.3), (20.0, 1.0)}
    plan = bo.step_plan(10.0, 0.5, bo.parse_parts("result=2"), 0.25)
    assert plan.draft_gpu_ms == 2.5 and plan.verify_gpu_ms == 7.5
    assert plan.host["result"] == 1.0 and plan.host["schedule"] == 0.5
    assert plan.host_total_ms == pytest.approx(0.5 * 6 + 1.0)
    with pytest.raises(ValueError):
        bo.step_plan(10.0, 0.5, bo.parse_parts(None), 1.5)


def _release(cells):
    release = {"cells": cells}
    release["targets"] = bo.evaluate_targets(release)
    return release


def _cell(gpu, host, stock, plugin, none):
    plan = bo.step_plan(gpu, host, bo.parse_parts(None), 0.2)
    return bo.summarize_cell(
        {
            "plan": plan.as_dict(),
            "rounds": {"stock": stock, "plugin": plugin, "none": none},
        }
    )


def test_targets_and_table_on_made_up_figures():
    cells = [
        _cell(10.0, 1.0, [80.0, 82.0, 81.0], [99.0, 100.0, 98.0], [100.0] * 3),
        _cell(2.0, 3.0, [47.0] * 3, [47.5] * 3, [47.6] * 3),
    ]
    assert cells[0]["steps_per_s"] == {"stock": 81.0, "plugin": 99.0, "none": 100.0}
    assert cells[0]["plugin_over_stock"] == pytest.approx(99.0 / 81.0)
    assert cells[0]["stock_over_plugin"] == pytest.approx(81.0 / 99.0)
    release = _release(cells)
    within, reported = release["targets"]
    assert within["verdict"] == "met"
    assert within["worst"] == pytest.approx(0.99)
    assert reported["deployment_cells"] == [pytest.approx(81.0 / 99.0)] * 2
    table = bo.render_table(release)
    lines = table.splitlines()
    assert len(lines) == 2 + len(cells)
    assert "plugin/stock" in lines[0] and "plugin/no-fill" in lines[0]
    assert "10*" in lines[2] and "1*" in lines[2]
    assert "*" not in lines[3]
    assert "1.222" in lines[2]
    line = bo.render_targets(release["targets"])
    assert "plugin within 1% of the no-fill loop in every cell: met" in line
    assert "in the * cells" in line

    cells.append(_cell(5.0, 0.3, [90.0], [95.0], [100.0]))
    assert _release(cells)["targets"][0]["verdict"] == "NOT met"
    assert bo.evaluate_targets({"cells": []})[0]["verdict"] == "n/a"


class RecordingOps:
    """Stands in for the device: records what the loop does, in order."""

    def __init__(self, log):
        self.log = log

    @contextlib.contextmanager
    def forward(self):
        self.log.append("forward[")
        yield
        self.log.append("]forward")

    def gpu(self, ms):
        self.log.append(f"gpu {ms:g}")

    def copy_out(self, slot):
        log = self.log
        log.append(f"copy {slot}")

        class Done:
            def synchronize(self):
                log.append(f"wait copy_done {slot}")

        return Done()

    def drain(self):
        self.log.append("drain")


def test_loop_runs_in_sglang_order():
    log: list[str] = []
    # A distinct weight per host part, so each wait names its part.
    weights = {part: float(k + 1) for k, part in enumerate(bo.HOST_PARTS)}
    plan = bo.step_plan(10.0, 1.0, weights, 0.2)
    by_ms = {ms: part for part, ms in plan.host.items()}

    def wait(ms):
        log.append(by_ms[ms])

    rate = bo.run_loop(
        RecordingOps(log),
        plan,
        lambda i: log.append(f"fill {i}"),
        lambda i: log.append(f"counts {i}"),
        steps=2,
        warmup=1,
        wait=wait,
    )
    assert rate > 0
    step = [
        "schedule",
        "counts {i}",
        "forward[",
        "build",
        "fill {i}",
        "draft_launch",
        "gpu 2",  # the draft
        "plan",
        "verify_launch",
        "gpu 8",  # the verify
        "finish",
        "]forward",
        "copy {i}",
    ]
    expected = [s.format(i=0) for s in step]
    for i in (1, 2):
        expected += [s.format(i=i) for s in step]
        # then the previous batch's result: its copy_done wait, then the host
        expected += [f"wait copy_done {i - 1}", "result"]
    expected += ["wait copy_done 2", "drain"]
    assert log == expected


def test_loop_without_fill_and_cell_rotation():
    log: list[str] = []
    plan = bo.step_plan(2.0, 0.05, bo.parse_parts(None), 0.2)
    fills = {
        "stock": lambda i: log.append("stock"),
        "plugin": lambda i: log.append("plugin"),
        "none": None,
    }
    cell = bo.run_cell(
        RecordingOps([]),
        plan,
        fills,
        lambda i: None,
        steps=1,
        warmup=0,
        rounds=3,
        modes=bo.DEFAULT_MODES,
        wait=lambda ms: None,
    )
    # one fill per step; round r starts with mode r: stock, plugin, none, ...
    assert log == ["stock", "plugin", "plugin", "stock", "stock", "plugin"]
    assert set(cell["rounds"]) == set(bo.DEFAULT_MODES)
    assert all(len(v) == 3 for v in cell["rounds"].values())
    assert cell["plan"]["gpu_ms"] == 2.0


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="SGLang is not installed"
)
def test_real_fills_on_cpu_through_the_loop():
    """The real stock and plugin fills of the installed SGLang, on CPU, in
    the loop with the recording stand-in (no timing)."""
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    was = REPAIR.instrumented
    for counts_mode in ("steady", "churn"):
        fills, schedule, info, close = bo.build_fills(
            device="cpu", dp=4, bs=8, gamma=None, counts_mode=counts_mode
        )
        try:
            assert set(fills) == set(bo.DEFAULT_MODES) and fills["none"] is None
            assert info["plugin_fill"]
            assert len(info["counts"]) == (1 if counts_mode == "steady" else 2)
            plan = bo.step_plan(2.0, 0.05, bo.parse_parts(None), 0.2)
            for mode in ("stock", "plugin", "none"):
                bo.run_loop(
                    RecordingOps([]),
                    plan,
                    fills[mode],
                    schedule,
                    steps=3,
                    warmup=1,
                    wait=lambda ms: None,
                )
        finally:
            close()
        # The repair is left as it was found.
        assert REPAIR.instrumented is was


def _watched_release(churn_peer: bool, out) -> None:
    """In a child process (it joins a gloo world): one release's grid on
    CPU in plugin and watch modes, the loop untimed; what the watch saw."""
    import json as _json

    if churn_peer:  # the peer sees other counts from step 1: a divergence
        peer = bo.run_watch_peer

        def churned(args, port):
            args.counts = "churn"  # the peer's own copy (a forked process)
            return peer(args, port)

        bo.run_watch_peer = churned
    args = bo.build_parser().parse_args(
        ["--gpu-ms", "2", "--host-ms", "0.05", "--steps", "5", "--warmup", "1"]
        + ["--rounds", "2", "--modes", "plugin", "watch", "--child-timeout", "120"]
    )
    result = bo.run_release(
        args, ops=RecordingOps([]), device="cpu", wait=lambda ms: None
    )
    out.put(_json.loads(_json.dumps(result, default=str)))


def _run_watched(churn_peer: bool) -> dict:
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_watched_release, args=(churn_peer, out))
    proc.start()
    try:
        return out.get(timeout=240)
    finally:
        proc.join(timeout=30)


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="SGLang is not installed"
)
def test_the_watch_mode_runs_the_real_sites_against_a_peer_rank():
    """``--modes ... watch``: a CPU peer rank repeats every watched call, so
    each decision the real worker-entry and draft-batch hooks (and the
    verify site's calls) hand the watch is compared and agrees: one per
    watched step, the prewarm's included; the cell has the watch's rate."""
    result = _run_watched(churn_peer=False)
    assert "error" not in result, result.get("error")
    watch = result["watch"]
    assert watch["failed"] == "" and watch["alarms"] == [] == watch["peer_alarms"]
    calls = bo.PREWARM_ROUNDS + 2 * (1 + 5)  # steady counts: one batch
    assert watch["decisions"] == {
        "worker step entry": calls,
        "draft DP sync sizes": calls,
        "compact-verify budget": calls,
    }, watch
    (cell,) = result["cells"]
    assert set(cell["rounds"]) == {"plugin", "watch"}
    assert cell["watch_over_plugin"] is not None


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="SGLang is not installed"
)
def test_a_peer_that_sees_other_counts_fails_the_watched_run():
    """The watch compares for real: a peer whose batches carry other counts
    from step 1 makes the run an error naming the draft DP sync sizes."""
    result = _run_watched(churn_peer=True)
    assert "the watch failed" in result.get("error", ""), result.get("watch")
    assert "draft DP sync sizes" in result["error"], result["error"]
