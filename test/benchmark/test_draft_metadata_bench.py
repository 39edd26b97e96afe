"""Fast CPU check of the draft-metadata fill benchmark on the installed SGLang.

Runs ``bench_fill.py compare`` (one child per mode, both on
``sys.executable``) with ``--device cpu --iters 50`` and checks the combined
JSON: every figure is there for both call patterns (steady: the same counts
every call; churn: counts that change every call), the GPU-only ones are
n/a, the targets are the four of issue 19 and the host buffers' pinning
(n/a where they need a GPU or a stock 0.5.17 row), and the plugin's fill leaves the DP/EP fields right. No
timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed", allow_module_level=True)

from sglang_dspark_dp_bench.draft_metadata import bench_fill

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmark" / "draft_metadata" / "bench_fill.py"
#: The host-time figures of one pattern (the values are the machine's).
HOST_FIGURES = {"median", "p90", "mean", "min", "iters"}


@pytest.fixture(scope="module")
def combined(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "fill.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--device",
            "cpu",
            "--iters",
            "50",
            "--out",
            str(out),
            "compare",
            "--python",
            f"installed={sys.executable}",
            "--modes",
            "stock",
            "plugin",
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "| fill" in proc.stdout and "targets" in proc.stdout
    return json.loads(out.read_text())


def test_combined_json_has_every_figure(combined):
    for key in ("date", "device", "torch", "sglang_versions", "runs", "targets"):
        assert key in combined
    assert [r["mode"] for r in combined["runs"]] == ["stock", "plugin"]
    for r in combined["runs"]:
        assert "error" not in r, r
        assert r["host_us"]["iters"] == 50
        assert set(r["host_us"]) == HOST_FIGURES
        assert r["busy"] is None and r["device_allocs_per_step"] is None
        assert set(r["fill_fields"]) == {"unscaled", "non_padded", "non_padded_cpu"}
        assert r["dp_fields"]
    assert len(combined["targets"]) == 5
    # Nothing to pin on the CPU: the figure is there, and says n/a.
    assert [r["host_buffers_pinned"] for r in combined["runs"]] == [None, None]


def test_steady_and_churn_rows(combined):
    for r in combined["runs"]:
        assert set(r["patterns"]) == {"steady", "churn"}
        for figures in r["patterns"].values():
            assert figures["host_us"]["iters"] == 50
            assert set(figures["host_us"]) == HOST_FIGURES
            assert figures["busy"] is None
            assert figures["device_allocs_per_step"] is None
        # The top-level figures are the steady pattern's (as before the split).
        assert r["host_us"] == r["patterns"]["steady"]["host_us"]
        params = r["params"]
        assert params["churn_counts"] != params["counts"]
        assert params["churn_counts"][0] != params["counts"][0]


def test_host_figures_from_a_made_up_clock(monkeypatch):
    """The figures of the host time are those of the samples (a clock that
    makes the k-th call last ``DURATIONS[k]`` microseconds; no timing)."""
    durations = [5, 1, 4, 2, 3, 10, 6, 9, 7, 8]
    ticks = []
    for k, us in enumerate(durations):  # (start, end) of each timed call, ns
        ticks += [k * 100_000, k * 100_000 + us * 1000]
    clock = iter(ticks)
    monkeypatch.setattr(
        bench_fill, "time", SimpleNamespace(perf_counter_ns=lambda: next(clock))
    )
    calls = []
    args = SimpleNamespace(iters=len(durations))
    out = bench_fill._measure(None, [lambda: calls.append(1)], args, "cpu", 0)
    assert out["host_us"] == {
        "median": 5.5,
        "p90": 9.0,
        "mean": 5.5,
        "min": 1.0,
        "iters": len(durations),
    }
    assert len(calls) == len(durations) + 10  # ten warm-up calls, untimed
    assert out["busy"] is None and out["device_allocs_per_step"] is None


def test_table_has_a_row_per_pattern(combined):
    table = bench_fill.render_table(combined["runs"])
    lines = table.splitlines()
    assert " counts " in lines[0]
    assert len(lines) == 2 + 2 * len(combined["runs"])
    assert sum(" steady " in line for line in lines) == len(combined["runs"])
    assert sum(" churn " in line for line in lines) == len(combined["runs"])


def test_targets_name_both_ratios(combined):
    by_pattern = {t.get("pattern"): t for t in combined["targets"]}
    assert by_pattern["steady"]["limit"] == 0.15
    assert by_pattern["churn"]["limit"] == 0.5
    line = bench_fill.render_targets(combined["targets"])
    assert "steady median <= 0.15x" in line and "churn median <= 0.5x" in line
    # On CPU the host-blocked, allocation and pinning targets cannot be judged.
    assert [t["verdict"] for t in combined["targets"][:3]] == ["n/a"] * 3


def test_ratio_targets_on_synthetic_runs():
    """The ratio targets compare each plugin row with stock 0.5.17's row of
    the same pattern (no timing: made-up figures)."""

    def run(fill, mode, version, steady, churn):
        def fig(us):
            return {
                "host_us": {"median": us, "p90": us},
                "busy": {"host_ms": 0.2},
                "device_allocs_per_step": 0.0,
            }

        patterns = {"steady": fig(steady), "churn": fig(churn)}
        return {
            "fill": fill,
            "mode": mode,
            "sglang": version,
            "patterns": patterns,
            "host_us": patterns["steady"]["host_us"],
        }

    runs = [
        run("stock", "stock", "0.5.17", 40.0, 40.0),
        run("plugin", "plugin", "0.5.17", 4.0, 20.0),
        run("plugin", "plugin", "0.5.16", 8.0, 30.0),
    ]
    targets = {
        t.get("pattern", t["target"]): t for t in bench_fill.evaluate_targets(runs)
    }
    assert targets["steady"]["ratios"] == [0.1, 0.2]
    assert targets["steady"]["verdict"] == "NOT met"
    assert targets["churn"]["ratios"] == [0.5, 0.75]
    assert targets["churn"]["verdict"] == "NOT met"
    runs[2] = run("plugin", "plugin", "0.5.16", 5.0, 18.0)
    targets = {
        t.get("pattern", t["target"]): t for t in bench_fill.evaluate_targets(runs)
    }
    assert targets["steady"]["verdict"] == "met"
    assert targets["churn"]["verdict"] == "met"
    assert bench_fill.evaluate_targets(runs)[0]["verdict"] == "met"
    assert bench_fill.evaluate_targets(runs)[1]["verdict"] == "met"


def test_the_pinning_target_reads_each_plugin_run(monkeypatch):
    """A plugin run whose host buffers came back pageable fails the target;
    stock runs are not judged (made-up runs, no GPU)."""

    def run(fill, pinned):
        return {
            "fill": fill,
            "host_us": {"median": 1.0, "p90": 1.0},
            "busy": None,
            "device_allocs_per_step": None,
            "host_buffers_pinned": pinned,
        }

    def pinning(runs):
        (t,) = [
            t for t in bench_fill.evaluate_targets(runs) if "is_pinned" in t["target"]
        ]
        return t["verdict"]

    assert pinning([run("stock", None), run("plugin", True)]) == "met"
    assert pinning([run("plugin", True), run("plugin", False)]) == "NOT met"
    assert pinning([run("plugin", None)]) == "n/a"


def test_the_benchmark_asks_each_host_buffer_whether_it_is_pinned():
    """On CUDA the figure is each host tensor's own ``is_pinned()``, not
    the buffers' word for it; CPU and a stock fill have nothing to judge."""

    class Host:
        def __init__(self, pinned):
            self.pinned = pinned

        def is_pinned(self):
            return self.pinned

    def proposer(*hosts):
        from sglang_dspark_dp.srt.speculative.dspark_components import dspark_draft

        held = SimpleNamespace(host_tensors=lambda: list(hosts), pinned=True)
        p = SimpleNamespace()
        p.__dict__[dspark_draft._BUFFERS_ATTR] = ("cuda", held)
        return p

    pinned = bench_fill._host_buffers_pinned
    assert pinned(proposer(Host(True), Host(True)), "cuda") is True
    assert pinned(proposer(Host(True), Host(False)), "cuda") is False
    assert pinned(proposer(Host(True)), "cpu") is None
    assert pinned(SimpleNamespace(), "cuda") is None


def test_plugin_mode_fields_are_right(combined):
    plugin = combined["runs"][1]
    assert plugin["enable_num_token_non_padded"] is True
    assert plugin["fill_fields"] == {
        "unscaled": "ok",
        "non_padded": "ok",
        "non_padded_cpu": "ok",
    }
    assert plugin["driver"]["busy_rank"]["ok"], plugin["driver"]
    assert plugin["driver"]["idle_rank"]["ok"], plugin["driver"]
    assert plugin["correct"] is True and plugin["dp_fields"] == "present"


def test_stock_mode_matches_the_installed_release(combined):
    stock = combined["runs"][0]
    assert stock["fill"] == "stock"
    if stock["fill_fields"]["unscaled"] == "missing":  # e.g. 0.5.16
        assert stock["dp_fields"].startswith("missing → crash: TypeError")
    else:
        assert stock["dp_fields"] == "present"
