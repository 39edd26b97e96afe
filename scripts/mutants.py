"""Mutation check: every mutant in ``test/mutants.toml`` must be killed.

``python scripts/mutants.py [--only ID,...] [--keep DIR]`` copies the
checkout's tracked files into a scratch folder, then for each mutant in
turn applies it there (its ``find`` text, which must occur exactly once,
becomes ``replace``), runs the tests there (this Python, the copy's package
first on ``sys.path``) and puts the file back. A mutant is judged by the
whole suite of its release, not by the files beside it: first its own
``tests`` (``pytest -x``, the fast kill), and, if they pass, the rest of the
suite (``test/``, with the ``--ignore`` of ``test/benchmark`` and
``test/e2e`` that ``noxfile.py`` applies on every release but 0.5.17, its
own tests left out; ``pytest -x``). A mutant is

* ``killed`` when its tests fail, or the rest of the suite does and the
  test that failed there passes without the mutant (run again on the
  unmutated copy, so a test that fails anyway kills nothing);
* ``SURVIVED`` when the whole suite passes: the suite does not see that bug;
* ``not live`` when its ``live`` repair is not enabled on the installed
  release (the mutated code never runs there; reported, not counted);
* ``ERROR`` when its tests cannot run (collected nothing, interrupted), its
  ``find`` text is not in the file exactly once, or the failing test of the
  rest of the suite fails without the mutant too.

It prints one line per mutant (the test that killed it, and whether its own
tests or the rest of the suite did) and a table, and exits 0 only when
every live mutant is killed. A hand-kept list rather than a generating tool
(mutmut, cosmic-ray): each mutant here is one behaviour the promise table
(``docs/promises.md``) lists, with the tests that must see it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "test" / "mutants.toml"
#: As ``noxfile.py``'s ``BENCH_RELEASE`` and ``SCRIPT_TESTS``: the tests of
#: the scripts made for the GPU machine run in 0.5.17's session only.
BENCH_RELEASE = "0.5.17"
SCRIPT_TESTS = ("test/benchmark", "test/e2e")
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
PYTEST += ["-W", "ignore::UserWarning"]


def load(path: Path = LIST) -> list[dict]:
    """The mutants, each checked for the fields it needs."""
    mutants = tomllib.loads(path.read_text())["mutant"]
    seen: set[str] = set()
    for i, m in enumerate(mutants):
        for key in ("id", "promise", "file", "find", "replace", "tests"):
            if key not in m:
                raise ValueError(f"{path.name}: mutant {i} has no {key!r}")
        if m["id"] in seen:
            raise ValueError(f"{path.name}: mutant id {m['id']!r} is used twice")
        if m["find"] == m["replace"]:
            raise ValueError(f"{path.name}: mutant {m['id']!r} changes nothing")
        seen.add(m["id"])
    return mutants


#: What a copy of a folder that is not a git checkout (a scratch copy
#: itself, where the suite runs for a mutant) leaves out.
_NOT_COPIED = frozenset({".git", ".mutants-import", "__pycache__", ".pytest_cache"})


def _listed(root: Path) -> list[str]:
    """The checkout's tracked files and the untracked ones git does not
    ignore; outside a git checkout (a scratch copy), every file but the
    caches and the copy's import links."""
    found = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel"],
        capture_output=True,
        text=True,
    )
    if found.returncode == 0 and Path(found.stdout.strip()).resolve() == root.resolve():
        listed = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
        return [raw.decode() for raw in listed if raw]
    out = []
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not _NOT_COPIED.intersection(rel.parts) and not path.is_symlink():
            out.append(str(rel))
    return out


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked files (and untracked ones git does not ignore)
    into ``dest``; from a folder that is not a git checkout, its files."""
    for rel in _listed(ROOT):
        src = ROOT / rel
        if not src.is_file():
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


def import_paths(work: Path) -> list[str]:
    """What goes first on ``PYTHONPATH`` so that both distributions import
    from the scratch copy ``work``, ahead of their installs: the plugin's
    ``python/``, and a folder where ``sglang_dspark_dp_bench`` (whose
    package is ``benchmark/`` itself) links to the copy's ``benchmark/``."""
    link = work / ".mutants-import" / "sglang_dspark_dp_bench"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(work / "benchmark", target_is_directory=True)
    return [str(work / "python"), str(link.parent)]


def live_repairs() -> set[str]:
    """The repairs enabled on the installed release (a fresh process)."""
    code = (
        "import warnings; warnings.filterwarnings('ignore')\n"
        "from sglang_dspark_dp import registry\n"
        "print(','.join(s.repair for s in registry.instrument(apply=False) "
        "if s.enabled))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"could not probe the repairs: {proc.stderr[-2000:]}")
    return set(proc.stdout.strip().splitlines()[-1].split(","))


#: The test that every mutant's find text is in its file once: in a copy a
#: mutant is applied to, it fails on that mutant's text alone, so it would
#: "kill" every mutant that survived its own tests. Never a killer.
TEXT_TEST = (
    "test/unit/test_mutants_script.py::test_every_mutant_still_finds_its_text_once"
)


def suite_args(version: str, listed: list[str]) -> list[str]:
    """pytest arguments for the rest of the release's suite: ``test/`` as
    its ``tests`` session runs it (``test/unit`` on every release: more
    tests that may kill), less the mutant's ``listed`` tests and
    :data:`TEXT_TEST`."""
    args = ["test", f"--deselect={TEXT_TEST}"]
    if version != BENCH_RELEASE:
        args += [f"--ignore={t}" for t in SCRIPT_TESTS]
    for t in listed:
        args.append(f"--deselect={t}" if "::" in t else f"--ignore={t}")
    return args


def first_failure(output: str) -> str | None:
    """The node id of the first failing test in pytest's ``-q`` summary."""
    for line in output.splitlines():
        if line.startswith(("FAILED ", "ERROR ")):
            # "FAILED <node id> - <message>": a parameter's id may hold spaces.
            return line.split(" ", 1)[1].split(" - ", 1)[0]
    return None


def last_line(stdout: str, stderr: str) -> str:
    lines = [x for x in stdout.splitlines() if x.strip()]
    return lines[-1] if lines else stderr.strip()[-200:]


Pytest = Callable[[list[str]], "tuple[int, str, str]"]


def pytest_in(work: Path, env: dict[str, str]) -> Pytest:
    """Run pytest with ``args`` in ``work``: ``(exit code, stdout, stderr)``."""

    def run(args: list[str]) -> tuple[int, str, str]:
        proc = subprocess.run(
            [sys.executable, *PYTEST, *args],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
        return proc.returncode, proc.stdout, proc.stderr

    return run


def judge(m: dict, path: Path, version: str, pytest: Pytest) -> tuple[str, str, str]:
    """``(outcome, by, last line)`` of mutant ``m`` (``path``: its file in
    the scratch copy, which it is applied to and taken back from); ``by``:
    the test that killed it and in which phase."""
    text = path.read_text()
    if text.count(m["find"]) != 1:
        return "ERROR", "-", f"find text occurs {text.count(m['find'])} times"
    path.write_text(text.replace(m["find"], m["replace"]))
    try:
        rc, out, err = pytest(list(m["tests"]))
        if rc == 1:
            return "killed", f"its tests: {first_failure(out)}", last_line(out, err)
        if rc != 0:
            return "ERROR", "its tests", f"pytest exit {rc}: {last_line(out, err)}"
        rc, out, err = pytest(suite_args(version, list(m["tests"])))
        if rc == 0:
            return "SURVIVED", "-", last_line(out, err)
        if rc != 1:
            return "ERROR", "the suite", f"pytest exit {rc}: {last_line(out, err)}"
    finally:
        path.write_text(text)
    killer = first_failure(out)
    if killer is None:
        return "ERROR", "the suite", f"no failing test named: {last_line(out, err)}"
    again, out2, err2 = pytest([killer])  # the unmutated copy
    if again != 0:
        return (
            "ERROR",
            f"the suite: {killer}",
            f"it fails without the mutant too (pytest exit {again}): "
            + last_line(out2, err2),
        )
    return "killed", f"the suite: {killer}", last_line(out, err)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="comma-separated mutant ids")
    p.add_argument("--keep", default=None, help="use (and keep) this scratch folder")
    args = p.parse_args(argv)
    mutants = load()
    if args.only:
        wanted = [x.strip() for x in args.only.split(",") if x.strip()]
        unknown = sorted(set(wanted) - {m["id"] for m in mutants})
        if unknown:
            print(f"mutants: unknown id {unknown}", file=sys.stderr)
            return 2
        mutants = [m for m in mutants if m["id"] in wanted]
    work = Path(args.keep or tempfile.mkdtemp(prefix="dspark-mutants-"))
    work.mkdir(parents=True, exist_ok=True)
    copy_checkout(work)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        import_paths(work) + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    live = live_repairs()
    import importlib.metadata as md

    version = md.version("sglang")
    print(f"mutants: sglang {version}; repairs enabled: {', '.join(sorted(live))}")
    rows = []
    start = time.monotonic()
    pytest = pytest_in(work, env)
    for m in mutants:
        began = time.monotonic()
        if m.get("live") and m["live"] not in live:
            outcome, by, last = "not live", "-", f"{m['live']} is not enabled"
        else:
            outcome, by, last = judge(m, work / m["file"], version, pytest)
        seconds = time.monotonic() - began
        rows.append((m["id"], outcome, seconds, by, last))
        print(
            f"mutants: {m['id']}: {outcome} ({seconds:.0f} s; {by}): {last}",
            flush=True,
        )
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    counted = [r for r in rows if r[1] != "not live"]
    killed = [r for r in counted if r[1] == "killed"]
    print()
    print(f"| mutant | outcome | seconds | by | sglang {version} |")
    print("|---|---|---|---|---|")
    for mid, outcome, seconds, by, last in rows:
        print(f"| {mid} | {outcome} | {seconds:.0f} | {by} | {last[:90]} |")
    total = time.monotonic() - start
    print(
        f"\nmutants: {len(killed)} of {len(counted)} live mutants killed on sglang "
        f"{version} ({len(rows) - len(counted)} not live here), {total:.0f} s"
    )
    return 0 if len(killed) == len(counted) and counted else 1


if __name__ == "__main__":
    sys.exit(main())
