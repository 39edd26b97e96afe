"""Unit tests of the pure parts of e2e/e2e_checks.py (no server, no GPU)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "e2e_checks.py"
_spec = importlib.util.spec_from_file_location("e2e_checks", SCRIPT)
ec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ec)

# Lines shaped like SGLang 0.5.16's format strings (cuda_graph_setup.py,
# metrics_reporter.py, scheduler logger prefix " DP{d} TP{t} EP{e}").
LOG = """\
[2026-01-01 10:00:00 DP0 TP0 EP0] Capture target verify CUDA graph begin. \
backend=full, num_tokens_per_req=5, bs=[1, 2, 4], avail mem=120.00 GB
[2026-01-01 10:00:09 DP0 TP0 EP0] Capture target verify CUDA graph end. \
elapsed=9.10 s, mem usage=1.20 GB, avail mem=118.80 GB.
[2026-01-01 10:00:10 DP0 TP0 EP0] Capture draft decode CUDA graph end. \
elapsed=3.00 s, mem usage=0.20 GB, avail mem=118.60 GB.
[2026-01-01 10:00:10 DP1 TP1 EP1] Capture target prefill CUDA graph end. \
elapsed=1.00 s, mem usage=0.10 GB, avail mem=118.60 GB.
[2026-01-01 10:01:00 DP0 TP0 EP0] Decode batch, #running-req: 16, #token: 900, \
token usage: 0.01, accept len: 2.10, accept rate: 0.28, cuda graph: True, \
gen throughput (token/s): 900.00, #queue-req: 0
[2026-01-01 10:01:00 DP1 TP1 EP1] Decode batch, #running-req: 16, #token: 880, \
token usage: 0.01, accept len: 2.00, accept rate: 0.25, cuda graph: False, \
gen throughput (token/s): 850.00, #queue-req: 0
"""
DP1_TRUE = (
    "[2026-01-01 10:01:01.123 DP1 TP1 EP1] Decode batch, #running-req: 3, "
    "#token: 90, token usage: 0.00, cuda graph: True, "
    "gen throughput (token/s): 80.00, #queue-req: 0"
)


def test_capture_ends_by_role_ignore_prefill():
    found = ec.find_capture_ends(LOG.splitlines())
    assert len(found["target"]) == 1 and "target verify" in found["target"][0]
    assert len(found["draft"]) == 1 and "draft decode" in found["draft"][0]


def test_capture_ends_none_on_begin_only():
    found = ec.find_capture_ends(LOG.splitlines()[:1])
    assert found == {"target": [], "draft": []}


def test_decode_graph_needs_every_dp_rank():
    ranks = ec.decode_graph_by_dp(LOG.splitlines())
    assert ranks[0]["True"] == 1 and ranks[1] == {"True": 0, "False": 1}
    ok, why = ec.check_decode_graph(ranks, dp=2)
    assert not ok and "DP [1]" in why
    ok, why = ec.check_decode_graph(
        ec.decode_graph_by_dp([*LOG.splitlines(), DP1_TRUE]), dp=2
    )
    assert ok and "DP1: True=1 False=1" in why


def test_decode_line_without_dp_prefix_is_ignored():
    line = "[2026-01-01 10:01:00 TP0] Decode batch, #running-req: 1, cuda graph: True"
    assert ec.decode_graph_by_dp([line]) == {}


def test_compare_outputs():
    a = [{"output_ids": [1, 2, 3], "text": "x"}, {"output_ids": [4], "text": "y"}]
    assert ec.compare_outputs(a, json.loads(json.dumps(a)))[0]
    b = [a[0], {"output_ids": [5], "text": "y"}]
    ok, why = ec.compare_outputs(a, b)
    assert not ok and "prompt 1" in why
    assert not ec.compare_outputs(a, a[:1])[0]
    assert ec.compare_outputs([{"text": "t"}], [{"text": "t"}])[0]


def test_gsm8k_errors_top_level_and_nested():
    good = {"num_questions": 50, "num_errors": 0, "errors": {}, "accuracy": 0.0}
    assert ec.gsm8k_errors(good)[0]
    assert ec.gsm8k_errors({"summary": good})[0]
    bad = dict(good, num_errors=2, errors={"HTTP 500": 2})
    ok, why = ec.gsm8k_errors(bad)
    assert not ok and "HTTP 500" in why
    assert not ec.gsm8k_errors({})[0]


def test_find_crash_line():
    lines = ["ok", f"  File x\n{ec.PLUGIN_CRASH}", "end"]
    assert ec.PLUGIN_CRASH in ec.find_line(lines, ec.PLUGIN_CRASH)
    assert ec.find_line(["ok"], ec.PLUGIN_CRASH) is None


def test_record_replaces_row_and_renders(tmp_path):
    path = tmp_path / "r.json"
    ec.record(path, "a", ec.FAILED, "first")
    ec.record(path, "b", ec.NOT_RUN, "x | y")
    data = ec.record(path, "a", ec.SEEN, "second")
    assert [r["check"] for r in data["checks"]] == ["b", "a"]
    md = ec.render_markdown(dict(data, meta={"gpus": 2}))
    assert "| a | seen | second |" in md and "x \\| y" in md and "- gpus: 2" in md


def test_cli_record_and_report(tmp_path):
    results, md = tmp_path / "r.json", tmp_path / "r.md"
    run = [sys.executable, str(SCRIPT), "--results", str(results)]
    rc = subprocess.run(
        [
            *run,
            "--check",
            "c1",
            "record",
            "--status",
            "not run",
            "--evidence",
            "no GPUs",
        ],
        capture_output=True,
    )
    assert rc.returncode == 0
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    rc = subprocess.run(
        [*run, "--check", "graphs", "decode-graph", "--log", str(log), "--dp", "2"],
        capture_output=True,
    )
    assert rc.returncode == 1
    rc = subprocess.run(
        [*run, "report", "--md", str(md), "--meta", "gpus=2"], capture_output=True
    )
    assert rc.returncode == 1  # one failed row
    text = md.read_text()
    assert "| c1 | not run | no GPUs |" in text and "| graphs | failed |" in text


def test_help_works():
    rc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True
    )
    assert rc.returncode == 0 and "decode-graph" in rc.stdout


def test_prompts_inside_tiny_vocab():
    vocab = json.loads((ROOT / "e2e/models/tiny-dsv4-target/config.json").read_text())[
        "vocab_size"
    ]
    assert all(0 <= t < vocab - 1 for p in ec.PROMPTS for t in p)
