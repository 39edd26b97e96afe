"""The compatibility table: one measured row per SGLang release.

``python scripts/compat.py row --out compat [--junit JUNIT]`` runs, in this
Python (a venv with one SGLang release and the plugin installed), what a
user would: ``sglang-dspark-dp doctor --json``, then a short ``verify`` with
``--no-fix`` (stock) and without (plugin on), both phases (startup capture
decision, decode lockstep). With ``--junit`` it also records that release's
suite result. It writes ``compat/<version>.json``.

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
    "+" marks uncommitted changes)."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
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
    row = {
        "sglang": version,
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "python": sys.version.split()[0],
        "doctor_exit": doctor.returncode,
        "missing_fields": report.get("missing_fields"),
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


def _draft_cell(row: dict) -> str:
    missing = row.get("missing_fields") or {}
    dp = missing.get("dp_attention_path") or []
    tp = missing.get("attention_tp_path") or []
    blocks = next(
        (
            r["detail"].get("stock_dp_fill_blocks")
            for r in row["repairs"]
            if r["repair"] == "draft-batch"
        ),
        None,
    )
    parts = []
    if dp:
        parts.append("DP path misses " + ", ".join(f"`{f}`" for f in dp))
    if tp:
        parts.append("TP path misses " + ", ".join(f"`{f}`" for f in tp))
    if blocks:
        parts.append("DP fill waits for the GPU")
    return "; ".join(parts) or "complete"


def _startup_cell(result: dict) -> str:
    cells = []
    for line in result["startup"]:
        where = line.split(",")[0] if "DP attention" not in line else "DP attention"
        if "hang" in line:
            cells.append(f"{where}: hang")
        elif "disagree" in line:
            cells.append(f"{where}: ranks disagree")
        else:
            cells.append(f"{where}: agree")
    return "; ".join(cells) or "-"


def _decode_cell(result: dict) -> str:
    for line in result["verdict"]:
        if "crashes under DP attention" in line:
            return "crash (`TypeError`)"
        if line.startswith("verify: OK"):
            return "lockstep"
        if "FAILED" in line and "startup" not in line:
            return "disagree"
    return "lockstep" if result["exit"] == 0 else "-"


def _phase_text(result: dict) -> str:
    """The phase lines and the verdicts (rows written before the phase lines
    were recorded carry only the verdicts)."""
    return " ".join(result.get("phases", []) + result["verdict"])


def _entry_cell(result: dict) -> str:
    text = _phase_text(result)
    if "every step crashes" in text or "to the DSpark worker raises" in text:
        return "every step raises `TypeError`"
    return "reaches the worker"


def _tier_cell(result: dict) -> str:
    # One line must say both: another phase's "diverge" (the startup
    # verdict) is not the compact-verify tier's.
    lines = result.get("phases", []) + result["verdict"]
    if any("compact-verify" in x and "diverge" in x for x in lines):
        return "tiers diverge; a late rank left out"
    return "agree"


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
    head = [
        "# Compatibility",
        "",
        "One measured row per SGLang release with DSpark, regenerated by "
        "`nox -s compat` (`scripts/compat.py`): what the plugin's probes found "
        "in the stock release, what each repair did, what a short "
        "`sglang-dspark-dp verify` (2 simulated ranks, one of them short of "
        "memory at startup; 200 decode steps per EP tier) shows without and "
        "with the plugin, and the release's test suite. Nothing here is "
        "written by hand.",
        "",
        "| SGLang | stock draft batch (probe) | repairs (`doctor`) | `verify "
        "--no-fix`: exit | `verify --no-fix`: "
        "startup | `verify --no-fix`: non-overlap | `verify --no-fix`: compact "
        "verify | `verify --no-fix`: decode | `verify` (plugin) | suite | "
        "measured (commit) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    body = []
    for row in sorted(rows, key=lambda r: _version_key(r["sglang"])):
        stock, fixed = row["verify_stock"], row["verify_plugin"]
        plugin = f"exit {fixed['exit']}: " + (
            "every phase agrees" if fixed["exit"] == 0 else "; ".join(fixed["verdict"])
        )
        body.append(
            "| "
            + " | ".join(
                [
                    row["sglang"],
                    _draft_cell(row),
                    f"{_repairs_cell(row)} (exit {row['doctor_exit']})",
                    str(stock["exit"]),
                    _startup_cell(stock),
                    _entry_cell(stock),
                    _tier_cell(stock),
                    _decode_cell(stock),
                    plugin,
                    _suite_cell(row),
                    f"{row['date']} (`{row.get('commit', 'unknown')}`)",
                ]
            )
            + " |"
        )
    notes = [
        "",
        "Reading a row: `startup` is the draft CUDA-graph capture decision "
        "under plain TP and under DP attention (attention TP 1); `hang` means "
        "the ranks that captured waited at the capture barrier for a rank "
        "that skipped. `non-overlap` is one prefill and one decode step "
        "through the installed scheduler with `--disable-overlap-schedule`. "
        "`compact verify` is the verify graph tier of 2 plain-TP ranks with "
        "drifting or late confidences. `decode` is the DP-attention lockstep "
        "of the draft batch's control-plane decisions. `verify` with the "
        "plugin runs the same phases. Each row's JSON (every line `verify` "
        "printed, each repair's reason) is in `compat/`.",
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
    r.add_argument("--out", default="compat")
    r.add_argument("--junit", default=None, help="the suite's JUnit XML")
    r.set_defaults(func=cmd_row)
    t = sub.add_parser("table", help="render every row into the table")
    t.add_argument("--rows", default="compat")
    t.add_argument("--out", default="COMPATIBILITY.md")
    t.set_defaults(func=cmd_table)
    c = sub.add_parser("check", help="exit 1 if the recorded suite failed")
    c.add_argument("junit")
    c.set_defaults(func=cmd_check)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
