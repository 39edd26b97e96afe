"""``scripts/watch_soak.py``: the watch over DSpark's real decisions with the
plugin on says nothing and the script exits 0; stock, the known defects
alarm and it exits 1 (every release has at least the compact-verify tier
divergence and the startup one under DP attention); bad input is one line
and exit 2. With the scripts made for measurement runs: 0.5.17's session."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "watch_soak", ROOT / "scripts" / "watch_soak.py"
)
soak = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(soak)


def test_with_the_plugin_no_alarm_and_stock_alarms(capsys):
    assert soak.main(["--ranks", "2", "--steps", "6"]) == 0
    out = capsys.readouterr().out
    assert "watch_soak: no alarm" in out
    # Both scenarios, the draft steps, both startup layouts.
    rows = [x.split(" | ") for x in out.splitlines() if x.startswith("| ")]
    assert [r[1] for r in rows[1:]] == ["2"] * 5, out
    assert "| draft steps, DP attention | 2 | 6 | 0 | yes | yes |" in out, out
    assert soak.main(["--ranks", "2", "--steps", "6", "--no-fix"]) == 1
    out = capsys.readouterr().out
    assert "watch_soak: FAILED" in out and "alarm: " in out, out


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--ranks", "9"], "--ranks must be between 2 and 8, got [9]"),
        (["--steps", "0"], "--steps must be at least 1, got 0"),
    ],
)
def test_bad_input_is_one_line(argv, says, capsys):
    assert soak.main(argv) == 2
    assert says in capsys.readouterr().err
