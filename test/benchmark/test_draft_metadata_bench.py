"""Fast CPU check of the draft-metadata fill benchmark on the installed SGLang.

Runs ``bench_fill.py compare`` (one child per mode, both on
``sys.executable``) with ``--device cpu --iters 50`` and checks the combined
JSON: every figure is there, the GPU-only ones are n/a, and the plugin's
fill leaves the DP/EP fields right.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

if importlib.util.find_spec("sglang") is None:
    pytest.skip("SGLang is not installed", allow_module_level=True)

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "benchmark" / "draft_metadata" / "bench_fill.py"


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
        assert 0 < r["host_us"]["median"] <= r["host_us"]["p90"]
        assert r["busy"] is None and r["device_allocs_per_step"] is None
        assert set(r["fill_fields"]) == {"unscaled", "non_padded", "non_padded_cpu"}
        assert r["dp_fields"]
    assert len(combined["targets"]) == 3


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
