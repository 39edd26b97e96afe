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
    from sglang_dspark_dp import upstream

    row = copy.deepcopy(rows[0])
    row["doctor_exit"] = 3
    row["verify_stock"]["exit"] = 7
    row["verify_stock"]["verdict"] = ["verify: FAILED: ranks disagree"]
    row["suite"] = {"passed": 5, "failed": 2, "skipped": 1}
    row["verify_plugin"] = {
        "exit": 0,
        "startup": [],
        "phases": [],
        "verdict": ["verify: OK: agreed"],
    }
    states = ["in this build", "not in this build", "not affected"]
    row["judge"] = [
        {"change": c.key, "state": states[i % 3], "evidence": "e", "repair": "r"}
        for i, c in enumerate(upstream.CHANGES)
    ]
    row["changes"] = [
        {"change": c.key, "state": "-", "repair": f"repair-{i}"}
        for i, c in enumerate(upstream.CHANGES)
    ]
    cells = _line(compat.render([row]), row["sglang"])
    n = len(upstream.CHANGES)
    assert cells[1 : n + 1] == [
        ["in", f"**not in**: repair-{i}", "not affected"][i % 3] for i in range(n)
    ]
    assert cells[n + 1].endswith("(exit 3)")
    assert cells[n + 2] == "exit 7: verify: FAILED: ranks disagree"
    assert cells[n + 3] == "exit 0: every phase agrees"
    assert cells[n + 4] == "5 passed, 2 failed, 1 skipped"
    row["suite"] = None
    row["judge"] = []
    again = _line(compat.render([row]), row["sglang"])
    assert again[n + 4] == "not run"
    assert again[1 : n + 1] == ["-"] * n


def test_the_header_names_every_upstream_change(compat, rows):
    from sglang_dspark_dp import upstream

    header = next(
        x for x in compat.render(rows).splitlines() if x.startswith("| SGLang |")
    )
    for c in upstream.CHANGES:
        assert f" {c.label} |" in header
