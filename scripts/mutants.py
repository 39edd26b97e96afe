"""Mutation check: every mutant in ``test/mutants.toml`` must be killed.

``python scripts/mutants.py [--only ID,...] [--keep DIR]`` copies the
checkout's tracked files into a scratch folder, then for each mutant in
turn applies it there (its ``find`` text, which must occur exactly once,
becomes ``replace``), runs its tests there (``pytest -x``, this Python, the
copy's package first on ``sys.path``), and puts the file back. A mutant is

* ``killed`` when its tests fail;
* ``SURVIVED`` when they pass: the suite does not see that bug;
* ``not live`` when its ``live`` repair is not enabled on the installed
  release (the mutated code never runs there; reported, not counted);
* ``ERROR`` when its tests cannot run (collected nothing, interrupted) or
  its ``find`` text is not in the file exactly once.

It prints one line per mutant and a table, and exits 0 only when every live
mutant is killed. A hand-kept list rather than a generating tool (mutmut,
cosmic-ray): each mutant here is one behaviour the README promises, with
the tests that must see it, and a run costs one SGLang import per test
file instead of the whole suite per generated mutant.
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
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "test" / "mutants.toml"


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


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked files (and untracked ones git does not ignore)
    into ``dest``."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-co", "--exclude-standard", "-z"],
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in listed:
        if not raw:
            continue
        rel = raw.decode()
        src = ROOT / rel
        if not src.is_file():
            continue
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


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


def run_one(m: dict, work: Path, env: dict[str, str]) -> tuple[str, float, str]:
    """``(outcome, seconds, the last line of pytest's output)``."""
    path = work / m["file"]
    text = path.read_text()
    if text.count(m["find"]) != 1:
        return "ERROR", 0.0, f"find text occurs {text.count(m['find'])} times"
    path.write_text(text.replace(m["find"], m["replace"]))
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-x",
                "-q",
                "-p",
                "no:cacheprovider",
                "-W",
                "ignore::UserWarning",
                *m["tests"],
            ],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=3600,
        )
    finally:
        path.write_text(text)
    seconds = time.monotonic() - start
    lines = [x for x in proc.stdout.splitlines() if x.strip()]
    last = lines[-1] if lines else proc.stderr.strip()[-200:]
    if proc.returncode == 1:
        return "killed", seconds, last
    if proc.returncode == 0:
        return "SURVIVED", seconds, last
    return "ERROR", seconds, f"pytest exit {proc.returncode}: {last}"


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
        [str(work / "python"), str(work / "benchmark")]
        + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    live = live_repairs()
    import importlib.metadata as md

    version = md.version("sglang")
    print(f"mutants: sglang {version}; repairs enabled: {', '.join(sorted(live))}")
    rows = []
    start = time.monotonic()
    for m in mutants:
        if m.get("live") and m["live"] not in live:
            outcome, seconds, last = "not live", 0.0, f"{m['live']} is not enabled"
        else:
            outcome, seconds, last = run_one(m, work, env)
        rows.append((m["id"], outcome, seconds, last))
        print(f"mutants: {m['id']}: {outcome} ({seconds:.0f} s): {last}", flush=True)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    counted = [r for r in rows if r[1] != "not live"]
    killed = [r for r in counted if r[1] == "killed"]
    print()
    print(f"| mutant | outcome | seconds | sglang {version} |")
    print("|---|---|---|---|")
    for mid, outcome, seconds, last in rows:
        print(f"| {mid} | {outcome} | {seconds:.0f} | {last[:90]} |")
    total = time.monotonic() - start
    print(
        f"\nmutants: {len(killed)} of {len(counted)} live mutants killed on sglang "
        f"{version} ({len(rows) - len(counted)} not live here), {total:.0f} s"
    )
    return 0 if len(killed) == len(counted) and counted else 1


if __name__ == "__main__":
    sys.exit(main())
