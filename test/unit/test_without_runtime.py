"""The plugin and its diagnostics in a Python without SGLang's runtime (the
wrong venv): one clear line, exit 2, no traceback. Each runs in a fresh
interpreter where ``torch`` (or ``sglang``) cannot be imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

HIDE = "import sys\nsys.modules[{name!r}] = None\n"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("hidden", "says"),
    [
        ("torch", "torch, which SGLang needs, is not installed"),
        ("sglang", "SGLang is not installed"),
    ],
)
@pytest.mark.parametrize(
    "argv", [["doctor"], ["doctor", "--json"], ["verify"], ["repro"], ["judge"]]
)
def test_cli_says_what_is_missing_and_exits_2(hidden, says, argv):
    code = HIDE.format(name=hidden) + (
        f"from sglang_dspark_dp.cli import main\nsys.exit(main({argv!r}))\n"
    )
    proc = run(code)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0] and sys.executable in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr
    if "--json" in argv:
        import json

        assert json.loads(proc.stdout)["dspark_present"] is False


def test_register_logs_what_is_missing():
    code = HIDE.format(name="torch") + (
        "from sglang_dspark_dp.plugin import register\nregister()\nprint('started')\n"
    )
    proc = run(code)
    assert proc.returncode == 0 and proc.stdout.strip() == "started", proc.stderr
    lines = [x for x in proc.stderr.splitlines() if "sglang-dspark-dp:" in x]
    assert len(lines) == 1, proc.stderr
    assert "not applied: torch, which SGLang needs, is not installed" in lines[0]
    assert "sglang not installed" not in lines[0]


def test_importing_the_package_imports_neither_torch_nor_sglang():
    code = (
        "import sys, sglang_dspark_dp, sglang_dspark_dp.plugin, sglang_dspark_dp.cli\n"
        "print(sorted(m for m in ('torch', 'sglang') if m in sys.modules))\n"
    )
    proc = run(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
