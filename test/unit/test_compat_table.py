"""The compatibility table renders the committed rows, and says what they say.

``scripts/compat.py`` is a script, not part of the package: loaded here by
path. Nothing here imports SGLang; the rows are the committed JSON."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compat():
    spec = importlib.util.spec_from_file_location("compat", ROOT / "scripts/compat.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def rows():
    found = [
        json.loads(p.read_text()) for p in sorted((ROOT / "compat").glob("*.json"))
    ]
    if not found:
        pytest.skip("no compatibility rows committed")
    return found


def _line(table: str, version: str) -> list[str]:
    lines = [x for x in table.splitlines() if x.startswith(f"| {version} |")]
    assert len(lines) == 1, f"{version}: {len(lines)} table lines"
    return [c.strip() for c in lines[0].strip("|").split("|")]


def test_the_committed_table_is_the_rendering_of_the_committed_rows(compat, rows):
    assert (ROOT / "COMPATIBILITY.md").read_text() == compat.render(rows)


def test_each_row_is_one_line_in_version_order(compat, rows):
    table = compat.render(rows)
    versions = [r["sglang"] for r in rows]
    in_table = sorted(versions, key=lambda v: table.index(f"| {v} |"))
    assert in_table == sorted(versions, key=compat._version_key)
    header = next(x for x in table.splitlines() if x.startswith("| SGLang |"))
    for v in versions:
        assert len(_line(table, v)) == header.count("|") - 1


def test_cells_follow_the_row(compat, rows):
    row = copy.deepcopy(rows[0])
    row["doctor_exit"] = 3
    row["verify_stock"]["exit"] = 7
    row["suite"] = {"passed": 5, "failed": 2, "skipped": 1}
    row["verify_plugin"] = {
        "exit": 1,
        "startup": [],
        "phases": [],
        "verdict": ["verify: FAILED: ranks disagree"],
    }
    cells = _line(compat.render([row]), row["sglang"])
    assert cells[2].endswith("(exit 3)")
    assert cells[3] == "7"
    assert cells[8] == "exit 1: verify: FAILED: ranks disagree"
    assert cells[9] == "5 passed, 2 failed, 1 skipped"
    row["suite"] = None
    assert _line(compat.render([row]), row["sglang"])[9] == "not run"


def test_stock_entry_and_tier_cells_read_the_phase_lines(compat):
    crash = {"phases": ["non-overlap: every step crashes (TypeError)"], "verdict": []}
    fine = {"phases": ["non-overlap: reaches the worker"], "verdict": []}
    assert compat._entry_cell(crash) == "every step raises `TypeError`"
    assert compat._entry_cell(fine) == "reaches the worker"
    drift = {"phases": ["compact-verify: tiers diverge (8 vs 2)"], "verdict": []}
    assert compat._tier_cell(drift).startswith("tiers diverge")
    assert compat._tier_cell(fine) == "agree"


def test_tier_cell_is_not_fooled_by_another_phase_diverging(compat):
    result = {
        "phases": ["compact-verify: TP 2, fixed: all 2 ranks agreed at 40 steps"],
        "verdict": ["verify: FAILED: the ranks' startup capture decisions diverge"],
    }
    assert compat._tier_cell(result) == "agree"
