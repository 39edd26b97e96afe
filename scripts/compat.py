"""The compatibility table: one measured row per SGLang release, in upstream
changes.

``python scripts/compat.py row --out compat [--junit JUNIT]`` runs, in this
Python (a venv with one SGLang release and the plugin installed), what a
user and a maintainer would: ``sglang-dspark-dp judge --json`` (the build
alone, plugin off: each upstream change in it, not in it, or not affecting
it), ``doctor --json`` (which repair stands in for what), then a short
``verify`` with ``--no-fix`` (stock) and without (plugin on), every phase.
With ``--junit`` it also records that release's suite result. It writes
``compat/<version>.json``.

``python scripts/compat.py table --rows compat --out COMPATIBILITY.md``
renders every row there into the table the README links to. ``nox -s
compat`` does both for every release (see ``noxfile.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

VERIFY = ["verify", "--steps", "200", "--dp", "2", "--no-progress"]
JUDGE = ["judge", "--json", "--steps", "40"]


def _cli(*argv: str) -> subprocess.CompletedProcess:
    code = "import sys; from sglang_dspark_dp.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        timeout=900,
    )


def _verify(no_fix: bool) -> dict:
    proc = _cli(*VERIFY, *(["--no-fix"] if no_fix else []))
    lines = proc.stdout.splitlines()
    return {
        "exit": proc.returncode,
        "startup": [x[len("startup: ") :] for x in lines if x.startswith("startup: ")],
        "phases": [
            x for x in lines if x.startswith(("non-overlap: ", "compact-verify: "))
        ],
        "verdict": [x for x in lines if x.startswith("verify: ")],
    }


def _suite(junit: str | None) -> dict | None:
    if not junit:
        return None
    root = ET.parse(junit).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)

    def total(key: str) -> int:
        return sum(int(s.get(key, 0)) for s in suites)

    ran = total("tests") - total("skipped")
    bad = total("failures") + total("errors")
    return {"passed": ran - bad, "failed": bad, "skipped": total("skipped")}


#: Where this script writes, relative to the checkout (the defaults of
#: ``row --out``, ``table --rows`` and ``table --out``).
ROWS_DIR, TABLE = "compat", "COMPATIBILITY.md"


def _git(*argv: str) -> str:
    root = Path(__file__).resolve().parent.parent
    return subprocess.run(
        ["git", "-C", str(root), *argv],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout.strip()


def _commit() -> str:
    """The plugin's commit this row measured ("unknown" outside a checkout;
    "+" marks uncommitted changes, other than the rows and the table this
    script writes itself)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git(
            "status", "--porcelain", "--untracked-files=no", "--",
            ".", f":(exclude){ROWS_DIR}", f":(exclude){TABLE}",
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+" if dirty else "")


def cmd_row(args: argparse.Namespace) -> int:
    doctor = _cli("doctor", "--json")
    try:
        report = json.loads(doctor.stdout)
    except json.JSONDecodeError:
        print(doctor.stdout + doctor.stderr, file=sys.stderr)
        return 2
    version = report.get("sglang_version") or "unknown"
    judge = _cli(*JUDGE)
    try:
        verdicts = json.loads(judge.stdout)
    except json.JSONDecodeError:
        print(judge.stdout + judge.stderr, file=sys.stderr)
        return 2
    row = {
        "sglang": version,
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "python": sys.version.split()[0],
        "doctor_exit": doctor.returncode,
        "judge_exit": judge.returncode,
        "judge": verdicts,
        "missing_fields": report.get("missing_fields"),
        "changes": report.get("changes", []),
        "repairs": [
            {
                "repair": r["repair"],
                "outcome": r["outcome"],
                "reason": r["reason"],
                "detail": r.get("detail", {}),
            }
            for r in report.get("repairs", [])
        ],
        "verify_stock": _verify(no_fix=True),
        "verify_plugin": _verify(no_fix=False),
        "suite": _suite(args.junit),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{version}.json"
    path.write_text(json.dumps(row, indent=2, sort_keys=True) + "\n")
    print(f"compat: wrote {path}")
    return 0


def _version_key(v: str) -> tuple:
    return tuple(int(p) if p.isdigit() else 0 for p in v.split("."))


def _change_cell(row: dict, key: str) -> str:
    """What ``judge`` found of one change (plugin off) and, where the build
    lacks it, the repair that stands in for it (``doctor``)."""
    verdict = next((v for v in row.get("judge", []) if v["change"] == key), None)
    if verdict is None:
        return "-"
    state = verdict["state"]
    if state == "in this build":
        return "in"
    if state == "not affected":
        return "not affected"
    repair = next(
        (c["repair"] for c in row.get("changes", []) if c["change"] == key), "-"
    )
    return f"**not in**: {repair}"


def _verify_cell(result: dict) -> str:
    if result["exit"] == 0:
        return "exit 0: every phase agrees"
    failed = [x for x in result["verdict"] if "FAILED" in x]
    return f"exit {result['exit']}: " + ("; ".join(failed) or "-")


def _repairs_cell(row: dict) -> str:
    return "; ".join(f"{r['repair']}: {r['outcome']}" for r in row["repairs"])


def _suite_cell(row: dict) -> str:
    s = row.get("suite")
    if not s:
        return "not run"
    text = f"{s['passed']} passed"
    if s["failed"]:
        text += f", {s['failed']} failed"
    if s["skipped"]:
        text += f", {s['skipped']} skipped"
    return text


def render(rows: list[dict]) -> str:
    from sglang_dspark_dp import upstream

    head = [
        "# Compatibility",
        "",
        "One measured row per SGLang release with DSpark, regenerated by "
        "`nox -s compat` (`scripts/compat.py`), in upstream changes: whether "
        "the release carries each one, judged by behaviour with the plugin off "
        "(`sglang-dspark-dp judge`), and where it does not, which repair of "
        "the plugin stands in for it (`doctor`); then what a short "
        "`sglang-dspark-dp verify` (2 simulated ranks, one of them short of "
        "memory at startup; 200 decode steps per EP tier) shows without and "
        "with the plugin, and the release's test suite (its benchmark-script "
        "tests aside). Nothing here is written by hand.",
        "",
        "| SGLang | "
        + " | ".join(c.label for c in upstream.CHANGES)
        + " | repairs (`doctor`) | `verify --no-fix` | `verify` (plugin) | suite "
        "| measured (commit) |",
        "|---|" + "---|" * (len(upstream.CHANGES) + 5),
    ]
    body = []
    for row in sorted(rows, key=lambda r: _version_key(r["sglang"])):
        body.append(
            "| "
            + " | ".join(
                [
                    row["sglang"],
                    *(_change_cell(row, c.key) for c in upstream.CHANGES),
                    f"{_repairs_cell(row)} (exit {row['doctor_exit']})",
                    _verify_cell(row["verify_stock"]),
                    _verify_cell(row["verify_plugin"]),
                    _suite_cell(row),
                    f"{row['date']} (`{row.get('commit', 'unknown')}`)",
                ]
            )
            + " |"
        )
    changes = [
        f"- `{c.label}`"
        + ("" if c.label == c.key else f" ({c.key})")
        + f": {c.summary}; "
        + (f"first in {c.first_release}" if c.first_release else "in no release yet")
        + "."
        for c in upstream.CHANGES
    ]
    notes = [
        "",
        "The changes (`sglang_dspark_dp/upstream.py`):",
        "",
        *changes,
        "",
        "Reading a row: `in` means the build carries the change, `not affected` "
        "that the code it fixes is absent, `not in` that its defect is there "
        "(named with the repair that stands in for it). `verify` runs the "
        "process-state phase (the plugin loaded after torch.distributed init), "
        "the startup capture decision under plain TP and DP attention, the "
        "non-overlap entry, compact verify (drift and a late relay) and the "
        "draft batch's DP-attention lockstep; `--no-fix` runs them on stock "
        "SGLang. Each row's JSON (every verdict with its evidence, every line "
        "`verify` printed, each repair's reason) is in `compat/`.",
        "",
    ]
    return "\n".join(head + body + notes)


def cmd_table(args: argparse.Namespace) -> int:
    rows = [json.loads(p.read_text()) for p in sorted(Path(args.rows).glob("*.json"))]
    if not rows:
        print(f"compat: no rows in {args.rows}", file=sys.stderr)
        return 2
    Path(args.out).write_text(render(rows))
    print(f"compat: {args.out}: {len(rows)} releases")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Fail (exit 1) when the recorded suite had failures."""
    suite = _suite(args.junit)
    if suite and suite["failed"]:
        print(f"compat: the suite failed ({suite['failed']} failures)", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("row", help="measure this Python's SGLang release")
    r.add_argument("--out", default=ROWS_DIR)
    r.add_argument("--junit", default=None, help="the suite's JUnit XML")
    r.set_defaults(func=cmd_row)
    t = sub.add_parser("table", help="render every row into the table")
    t.add_argument("--rows", default=ROWS_DIR)
    t.add_argument("--out", default=TABLE)
    t.set_defaults(func=cmd_table)
    c = sub.add_parser("check", help="exit 1 if the recorded suite failed")
    c.add_argument("junit")
    c.set_defaults(func=cmd_check)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
