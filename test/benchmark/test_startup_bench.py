"""CPU checks of the start-up cost script (``bench_startup.py``).

Its pure pieces (argument parsing, the per-release summary, the table and
the target line) on made-up samples, and one end-to-end run of one fresh
interpreter on this Python. No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_dspark_dp_bench.draft_metadata import bench_startup as bs

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmark" / "draft_metadata" / "bench_startup.py"


def test_parse_targets():
    assert bs.parse_targets(["0.5.17=/v/bin/python", "/w/bin/python"]) == [
        ("0.5.17", "/v/bin/python"),
        (None, "/w/bin/python"),
    ]
    for bad in ("=/x", "label="):
        with pytest.raises(ValueError):
            bs.parse_targets([bad])


def _sample(total, sglang_new=()):
    phases = {
        "import": total * 0.1,
        "register": total * 0.5,
        "apply_hooks": total * 0.4,
        "total": total,
    }
    return {
        "ms": phases,
        "cpu_ms": {k: v / 2 for k, v in phases.items()},
        "new_modules": {
            "total": 3,
            "sglang": list(sglang_new),
            "sglang_dspark_dp": 3,
            "other_top_level": [],
        },
        "repairs": {"draft-batch": "enabled", "startup-capture": "enabled"},
        "sglang": "0.5.17",
        "torch": "2.11.0",
        "preload": "patched",
        "preload_missing": [],
    }


def test_summary_table_and_target_on_made_up_samples():
    good = bs.summarize(
        None, "/py", [_sample(90.0), _sample(110.0, ["sglang.x"]), _sample(100.0)]
    )
    assert good["label"] == "0.5.17"
    assert good["median_ms"]["total"] == 100.0
    assert good["median_cpu_ms"]["total"] == 50.0
    assert good["total_ms_range"] == [90.0, 110.0]
    assert good["new_sglang_modules"] == ["sglang.x"]
    assert good["target_met"] is True
    slow = bs.summarize("slow", "/py", [_sample(250.0)])
    assert slow["target_met"] is False
    broken = bs.summarize("broken", "/py", [{"error": "child exited 1"}])
    assert broken["error"] == "child exited 1"

    table = bs.render_table([good, slow, broken])
    lines = table.splitlines()
    assert len(lines) == 2 + 3
    assert "total ms (median)" in lines[0]
    assert "100.0" in lines[2] and "90.0-110.0" in lines[2]
    assert "child exited 1" in lines[4]
    assert bs.render_target([good]).startswith(
        "target (<= 200 ms added per scheduler process, median): met"
    )
    assert "NOT met" in bs.render_target([good, slow])
    assert bs.render_target([broken]).endswith("n/a")


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="SGLang is not installed"
)
def test_one_interpreter_end_to_end(tmp_path):
    out = tmp_path / "startup.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--runs", "1", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "total ms (median)" in proc.stdout and "target (" in proc.stdout
    combined = json.loads(out.read_text())
    assert combined["runs"] == 1 and combined["preload"] == "patched"
    (release,) = combined["releases"]
    assert "error" not in release, release
    for key in ("median_ms", "median_cpu_ms"):
        assert set(release[key]) == {"import", "register", "apply_hooks", "total"}
        assert all(v >= 0 for v in release[key].values())
    (sample,) = release["samples"]
    assert sample["preloaded"]  # the DSpark modules were imported first
    from sglang_dspark_dp import registry

    assert set(release["repairs"]) == set(registry.names())


def _main_sample(ms, plugin, sglang_new=()):
    return {
        "process": "main",
        "plugin": plugin,
        "ms": {"load_plugins": ms},
        "cpu_ms": {"load_plugins": ms / 2},
        "new_modules": {
            "total": 10 if plugin else 0,
            "sglang": list(sglang_new),
            "sglang_dspark_dp": 10 if plugin else 0,
            "other_top_level": [],
        },
        "sglang": "0.5.17",
    }


def _summaries(on, off, sglang_new=()):
    rows = []
    for plugin, values in ((True, on), (False, off)):
        rows.append(
            bs.summarize(
                None, "/py", [_main_sample(v, plugin, sglang_new) for v in values]
            )
        )
        rows[-1]["plugin"] = plugin
    return rows


def test_the_main_process_table_judges_the_difference_and_sglang_modules():
    # On minus off, medians: 30 - 15 = 15 ms <= 20 ms, no SGLang module.
    table = bs.render_main(_summaries([28.0, 30.0, 40.0], [15.0, 14.0, 16.0]))
    lines = table.splitlines()
    assert "| 0.5.17 | on     | 30.0" in lines[2]
    assert "| 0.5.17 | off    | 15.0" in lines[3]
    assert lines[-1].endswith("met (largest 15.0 ms, 0 SGLang modules)")
    # 21 ms added is over the target, whatever the absolute times.
    assert "NOT met (largest 21.0 ms" in bs.render_main(_summaries([36.0], [15.0]))
    # One SGLang module imported on the plugin's account fails it too.
    assert "NOT met" in bs.render_main(
        _summaries([16.0], [15.0], ["sglang.srt.managers.scheduler"])
    )


def test_the_scheduler_target_without_preload_is_the_difference():
    def sample(total, plugin):
        s = _sample(total)
        s["ms"]["dspark"] = total
        s["cpu_ms"]["dspark"] = total
        s["plugin"] = plugin
        return s

    on = bs.summarize("0.5.17", "/py", [sample(900.0, True)])
    off = bs.summarize("0.5.17", "/py", [sample(750.0, False)])
    on["plugin"], off["plugin"] = True, False
    assert bs.render_target([on, off]).endswith("met (largest 150.0 ms)")
    off["median_ms"]["total"] = 650.0
    assert "NOT met (largest 250.0 ms)" in bs.render_target([on, off])
    table = bs.render_table([on, off])
    assert "DSpark import ms" in table.splitlines()[0]
    assert "(no plugin)" in table.splitlines()[3]


@pytest.mark.skipif(
    importlib.util.find_spec("sglang") is None, reason="SGLang is not installed"
)
def test_the_main_process_end_to_end(tmp_path):
    out = tmp_path / "main.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--process", "main", "--runs", "1"]
        + ["--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    combined = json.loads(out.read_text())
    on, off = combined["releases"]
    assert (on["plugin"], off["plugin"]) == (True, False)
    # The plugin's own modules only: nothing of SGLang's on its account.
    assert on["new_sglang_modules"] == [] and on["new_modules_median"] > 0
    assert off["new_modules_median"] == 0
    assert "target (<= 20 ms" in proc.stdout
