"""The compatibility table renders the committed rows, and says what they say;
every row measured the repairs as they are committed (read from git).

``scripts/compat.py`` is a script, not part of the package: loaded here by
path. Nothing here imports SGLang; the rows are the committed JSON."""

from __future__ import annotations

import ast
import copy
import importlib.util
import json
import shutil
import subprocess
import tomllib
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


# --------------------------------------------------------------------------
# Freshness: every row measured the repairs as they are.
# --------------------------------------------------------------------------

PKG = ROOT / "python"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((PKG / "sglang_dspark_dp").rglob("*.py")):
        parts = list(path.relative_to(PKG).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _uses(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules ``name`` imports (at any depth of its code) or
    names in a string (the registry lists the repairs' modules by name),
    with the packages above each."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base]).strip(".")
            found.update([base, *(f"{base}.{a.name}" for a in node.names)])
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    out = set()
    for module in found & set(known):
        while module:
            out.add(module)
            module = module.rpartition(".")[0]
    return out & set(known)


def repair_code() -> list[Path]:
    """What decides what a row records of the repairs (what the probes find,
    what each repair does and says): every module a server that loads the
    plugin can run, i.e. the plugin's entry point (``pyproject.toml``) and
    all it reaches through imports and the registry's module names. The CLI
    and the harnesses measure the repairs and are not part of them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (entry,) = project["entry-points"]["sglang.srt.plugins"].values()
    known = _modules()
    todo, seen = [entry.partition(":")[0]], set()
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(_uses(name, known[name], known) - seen)
    return sorted(known[name] for name in seen)


def _git(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", "-C", str(ROOT), *argv], capture_output=True, text=True, timeout=60
    )


@pytest.fixture(scope="module")
def git_history():
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the rows' commits cannot be judged")
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.skip(f"{ROOT} is not a git checkout: the rows' commits cannot be judged")


def test_the_repair_code_is_what_a_server_runs():
    names = {str(p.relative_to(PKG / "sglang_dspark_dp")) for p in repair_code()}
    assert {"plugin.py", "registry.py", "adapter/worker.py", "upstream.py"} <= names
    repairs = ("srt/speculative/spec_tp_sync.py", "srt/managers/overlap_utils.py")
    assert set(repairs) <= names  # reached through the registry's names only
    assert "drivers/worker.py" in names  # the startup probe's stand-in
    assert not any(n.startswith(("cli/", "harness/")) for n in names), names


def test_every_row_measured_the_repairs_as_they_are(rows, git_history):
    """A row measured the repairs at its commit (a "+" after it: with
    uncommitted changes on top, which, once committed, are a later change):
    every commit that changed the repair code since must be in it, or the
    row describes repairs that are no longer the ones committed."""
    paths = [str(p.relative_to(ROOT)) for p in repair_code()]
    by_commit: dict[str, list[str]] = {}
    for row in rows:
        by_commit.setdefault(str(row.get("commit", "unknown")), []).append(
            row["sglang"]
        )
    stale = []
    for commit, versions in by_commit.items():
        which = f"{', '.join(versions)} (measured at {commit})"
        found = _git(
            "rev-parse", "--verify", "--quiet", f"{commit.rstrip('+')}^{{commit}}"
        )
        if found.returncode != 0:
            stale.append(f"{which}: not a commit of this clone")
            continue
        since = _git(
            "log", "--format=%h (%cs)", f"{found.stdout.strip()}..HEAD",
            "--", *paths,
        )  # fmt: skip
        assert since.returncode == 0, since.stderr
        changes = since.stdout.splitlines()
        if changes:
            stale.append(
                f"{which}: {len(changes)} later change(s) to the repairs, the "
                f"last {changes[0]}"
            )
    assert not stale, (
        "compatibility rows measured before the last change to the repairs "
        "(measure them again: nox -s compat):\n" + "\n".join(stale)
    )
