"""``diverge``: find where simulated ranks running the installed DSpark code
part ways, from PyTorch's flight recorder, and name the upstream change.

Three modes:

* search (default): ``hypothesis`` generates per-rank perturbation
  schedules, each played on ``--ranks`` gloo ranks with the plugin on (or
  off, ``--no-fix``); a schedule that diverges is shrunk to the smallest
  that still does, replayed once to confirm it, and its site masked so the
  search can find the next. With the plugin on, a long run with every
  perturbation (``--soak-steps`` per layout and rank count) follows;
* ``--replay SCHEDULE``: play one schedule (a finding's replay line);
* ``--explain DUMP_DIR``: read flight-recorder dumps (one file per rank,
  NCCL or gloo, as ``torch.distributed.flight_recorder`` reads them) of a
  hung server and name the DSpark decision site and the upstream change
  behind the first mismatch.

Exit 0: no divergence; 1: a divergence (or a crash every rank hit); 2:
cannot run (bad input, no DSpark, no hypothesis), in one line.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from sglang_dspark_dp.cli import common
from sglang_dspark_dp.cli.common import EXIT_CANNOT, EXIT_FAIL, EXIT_OK

#: The search's integer knobs, each at most 10,000: option, least, default, help.
_KNOBS = (
    ("--examples", 1, 40, "distinct schedules a search runs before it gives up"),
    ("--shrink-runs", 0, 24, "runs a search may spend shrinking a diverging schedule"),
    ("--max-steps", 1, 6, "decode steps a searched schedule has at most"),
)


def _finding_text(n: int, f: Any, replay_args: str) -> list[str]:
    lines = [f"finding {n}: {f.title()}"]
    where = "at startup" if f.step is None else f"at decode step {f.step}"
    lines.append(f"  what: {f.detail} ({where})")
    lines.append(f"  found by: {f.found_by}" + (f": {f.watch}" if f.watch else ""))
    for rank in sorted(f.ranks):
        site = f.call_sites.get(rank, "")
        lines.append(
            f"  rank {rank}: {f.ranks[rank]}" + (f"; call site {site}" if site else "")
        )
    causes = f.schedule.perturbations()
    lines.append(
        "  caused by: "
        + ("; ".join(causes) if causes else "no perturbation (the code path alone)")
    )
    shown = {r: v for r, v in f.inputs.items() if v}
    if shown:
        lines.append(
            "  decision inputs: "
            + "; ".join(
                f"rank {r} "
                + ", ".join(f"{k}={v}" for k, v in sorted(x.items()) if k != "done")
                for r, x in sorted(shown.items())
            )
        )
    lines.append(
        f"  replay: sglang-dspark-dp diverge{replay_args} --replay "
        f"'{f.schedule.replay()}'"
    )
    return lines


def _table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [
        fmt.format(*header).rstrip(),
        "  ".join("-" * w for w in widths),
        *(fmt.format(*r).rstrip() for r in rows),
    ]


def _replay_args(args: argparse.Namespace) -> str:
    out = " --no-fix" if args.no_fix else ""
    if args.hang != 3.0:
        out += f" --hang {args.hang:g}"
    return out


def _emit(args: argparse.Namespace, payload: dict[str, Any], lines: list[str]) -> None:
    if args.json:
        print(json.dumps(payload, indent=2, default=str))
    else:
        for line in lines:
            print(line, flush=True)


def _header(args: argparse.Namespace) -> str:
    from sglang_dspark_dp.package import installed_sglang_version

    return (
        f"diverge: sglang {installed_sglang_version() or 'unknown'}, plugin "
        f"{'off (--no-fix)' if args.no_fix else 'on'}"
    )


def _cmd_explain(args: argparse.Namespace) -> int:
    from sglang_dspark_dp.harness import diverge, flight

    try:
        dumps = flight.load_dir(args.explain)
    except flight.DumpError as exc:
        return common.cannot(exc, "cannot explain")
    sidecars = diverge.load_sidecars(args.explain)
    schedule = None
    for side in sidecars.values():
        try:
            schedule = diverge.Schedule.parse(side.get("schedule", ""))
            break
        except ValueError:
            continue
    mismatch, finding = diverge.explain(dumps, sidecars, schedule)
    entries = sum(len(d.entries) for d in dumps.values())
    head = (
        f"diverge --explain: {len(dumps)} rank dumps ({entries} collectives) in "
        f"{args.explain}" + (", with this tool's decision sidecars" if sidecars else "")
    )
    payload: dict[str, Any] = {
        "dumps": len(dumps),
        "ranks": sorted(dumps),
        "collectives": entries,
        "mismatch": mismatch.describe() if mismatch else None,
        "finding": finding.as_dict() if finding else None,
    }
    if finding is None:
        _emit(
            args,
            payload,
            [
                head,
                "no mismatch: every group's ranks entered the same "
                "collectives, as far as every rank's buffer reaches",
            ],
        )
        return EXIT_OK
    lines = [head, *_finding_text(1, finding, "")]
    if schedule is None:
        lines = [ln for ln in lines if not ln.startswith("  replay:")]
        lines = [ln for ln in lines if not ln.startswith("  caused by:")]
    _emit(args, payload, lines)
    return EXIT_FAIL


def _cmd_replay(args: argparse.Namespace) -> int:
    from sglang_dspark_dp.harness import diverge

    try:
        schedule = diverge.Schedule.parse(args.replay)
        diverge.check_installed()
        with diverge.repairs_as(not args.no_fix):
            out = diverge.run(
                schedule,
                fix=not args.no_fix,
                hang_s=args.hang,
                dump_dir=args.dump_dir,
                watch=args.watch,
            )
    except (ValueError, diverge.CannotRun) as exc:
        return common.cannot(exc, "cannot replay")
    payload = {
        "schedule": schedule.replay(),
        "fix": not args.no_fix,
        "diverged": out.diverged,
        "finding": out.finding.as_dict() if out.finding else None,
        "steps_done": out.steps_done,
        "errors": out.errors,
        "seconds": round(out.seconds, 2),
        "watch": {str(r): v for r, v in sorted(out.alarms.items())}
        if args.watch
        else None,
    }
    lines = [f"{_header(args)}, replay of {schedule.replay()}"]
    if out.finding is None:
        state = (
            "every rank ran every step"
            if out.complete
            else f"incomplete without a mismatch: {out.errors}"
        )
        lines.append(f"no divergence ({state}; {out.seconds:.1f} s)")
        for rank, said in sorted(out.alarms.items()):
            lines += [f"  watch, rank {rank}: {line}" for line in said]
        _emit(args, payload, lines)
        return EXIT_OK if out.complete else EXIT_FAIL
    lines += _finding_text(1, out.finding, _replay_args(args))
    _emit(args, payload, lines)
    return EXIT_FAIL


def _cmd_search(args: argparse.Namespace) -> int:
    from sglang_dspark_dp.harness import diverge

    try:
        diverge.check_installed()
    except diverge.CannotRun as exc:
        return common.cannot(exc)
    fix = not args.no_fix
    with diverge.repairs_as(fix):
        return _search_and_soak(args, fix)


def _search_and_soak(args: argparse.Namespace, fix: bool) -> int:
    from sglang_dspark_dp.harness import diverge

    soak_steps = (
        args.soak_steps if args.soak_steps is not None else (2000 if fix else 0)
    )
    if not args.json:
        print(
            f"{_header(args)}; ranks {', '.join(map(str, args.ranks))}, layouts "
            f"{', '.join(args.layouts)}; up to {args.examples} schedules a search "
            f"(<= {args.max_steps} steps), {args.shrink_runs} shrink runs, seed "
            f"{args.seed}, collectives time out after {args.hang:g} s",
            flush=True,
        )

    def said(s: Any) -> None:
        if args.json:
            return
        if s.finding is None:
            print(
                f"  search {s.layout}, {s.world} ranks: nothing new in {s.runs} "
                f"runs ({s.seconds:.1f} s)",
                flush=True,
            )
        else:
            print(
                f"  search {s.layout}, {s.world} ranks: {s.finding.title()} after "
                f"{s.runs} runs, {s.shrink_runs} of them shrinking ({s.seconds:.1f} s)",
                flush=True,
            )

    searches = []
    for n in args.ranks:
        searches += diverge.discover(
            args.layouts,
            n,
            fix=fix,
            examples=args.examples,
            shrink_runs=args.shrink_runs,
            max_steps=args.max_steps,
            seed=args.seed,
            hang_s=args.hang,
            on_search=said,
            watch=args.watch,
        )
    found = [s for s in searches if s.finding is not None]
    confirmed = []
    for k, s in enumerate(found, 1):
        where = None
        if args.dump_dir:
            where = f"{args.dump_dir}/finding-{k}"
        again = diverge.run(
            s.finding.schedule,
            fix=fix,
            masks=s.outcome.masks,
            hang_s=args.hang,
            dump_dir=where,
            watch=args.watch,
        )
        same = again.finding is not None and again.finding.site == s.finding.site
        confirmed.append(same)
    soaks = []
    if soak_steps:
        for n in args.ranks:
            for sched in diverge.soak_schedules(args.layouts, n, soak_steps, args.seed):
                out = diverge.run(sched, fix=fix, hang_s=args.hang, watch=args.watch)
                soaks.append(out)
                if not args.json:
                    said = [x for lines in out.alarms.values() for x in lines]
                    state = (
                        f"diverged: {out.finding.title()}"
                        if out.finding
                        else (
                            f"the watch alarmed: {said[0]}"
                            if said
                            else (
                                "agreed at every step"
                                if out.complete
                                else f"incomplete: {out.errors}"
                            )
                        )
                    )
                    print(
                        f"  soak {sched.layout}, {n} ranks, overlap "
                        f"{'on' if sched.overlap else 'off'}: {sched.steps} "
                        f"steps, {state} ({out.seconds:.1f} s)",
                        flush=True,
                    )
    bad_soaks = [
        o for o in soaks if o.finding is not None or not o.complete or o.alarms
    ]
    status = EXIT_FAIL if found or bad_soaks else EXIT_OK
    payload = {
        "sglang": _header(args).split("sglang ")[1].split(",")[0],
        "fix": fix,
        "ranks": list(args.ranks),
        "layouts": list(args.layouts),
        "seed": args.seed,
        "findings": [
            dict(
                s.finding.as_dict(),
                world=s.world,
                runs=s.runs,
                shrink_runs=s.shrink_runs,
                seconds=round(s.seconds, 2),
                reproduced=ok,
            )
            for s, ok in zip(found, confirmed, strict=True)
        ],
        "searches": [
            {
                "layout": s.layout,
                "world": s.world,
                "finding": s.finding.change if s.finding else None,
                "site": s.finding.site if s.finding else None,
                "runs": s.runs,
                "seconds": round(s.seconds, 2),
            }
            for s in searches
        ],
        "soak": [
            {
                "schedule": o.schedule.replay(),
                "diverged": o.diverged,
                "complete": o.complete,
                "steps": o.schedule.steps,
                "seconds": round(o.seconds, 2),
                "finding": o.finding.as_dict() if o.finding else None,
            }
            for o in soaks
        ],
        "exit": status,
    }
    lines: list[str] = []
    if found:
        rows = [
            (
                str(k),
                s.finding.title().split(": ")[0],
                s.finding.site,
                s.finding.kind,
                "startup" if s.finding.step is None else str(s.finding.step),
                str(s.world),
                f"{s.runs} ({s.shrink_runs} shrinking), {s.seconds:.1f} s",
                "yes" if ok else "NO",
            )
            for k, (s, ok) in enumerate(zip(found, confirmed, strict=True), 1)
        ]
        lines.append("")
        lines += _table(
            rows,
            (
                "#",
                "change",
                "site",
                "mismatch",
                "step",
                "ranks",
                "found after",
                "replayed",
            ),
        )
        lines.append("")
        for k, s in enumerate(found, 1):
            lines += _finding_text(k, s.finding, _replay_args(args))
    total = sum(o.schedule.steps for o in soaks)
    verdict = (
        f"diverge: {len(found)} finding(s)"
        + (f"; soak: {len(bad_soaks)} of {len(soaks)} runs failed" if soaks else "")
        if status
        else "diverge: OK: no divergence in "
        + f"{sum(s.runs for s in searches)} searched schedules"
        + (
            f" and {total} soak steps ({total // len(args.ranks)} per rank count, "
            "shared by the layouts)"
            if soaks
            else ""
        )
    )
    lines.append(verdict)
    _emit(args, payload, lines)
    return status


def cmd_diverge(args: argparse.Namespace) -> int:
    common.quiet_sglang()
    start = time.monotonic()
    if args.explain is not None:
        if args.replay is not None:
            common.err("--explain and --replay cannot be given together")
            return EXIT_CANNOT
        return _cmd_explain(args)
    try:
        if args.replay is not None:
            return _cmd_replay(args)
        return _cmd_search(args)
    except KeyboardInterrupt:
        common.err(f"interrupted after {time.monotonic() - start:.0f} s")
        return EXIT_CANNOT


def add_parser(sub: argparse._SubParsersAction) -> None:
    from sglang_dspark_dp.harness.diverge import LAYOUTS, WORLDS

    d = sub.add_parser(
        "diverge",
        help="find where simulated ranks' collectives part (flight recorder)",
        description=__doc__.split("\n\n")[0],
    )
    d.add_argument(
        "--ranks",
        type=common.choices_arg("--ranks", WORLDS, int),
        default=(4,),
        help="rank counts, comma-separated, of 2, 4, 8 (default 4)",
    )
    d.add_argument(
        "--layouts",
        type=common.choices_arg("--layouts", LAYOUTS),
        default=LAYOUTS,
        help="dp (DP attention, attention TP 1) and/or tp (plain TP); default both",
    )
    common.add_flag(d, "--no-fix", "stock SGLang (plugin off)")
    for name, lo, default, text in _KNOBS:
        common.add_int(d, name, lo, 10_000, default, f"{text} (default {default})")
    common.add_int(
        d,
        "--soak-steps",
        0,
        100_000,
        None,
        "decode steps of the long runs with every perturbation, per rank "
        "count, shared by the layouts, half with the overlap schedule on and "
        "half off (default 2000 with the plugin on, 0 with --no-fix)",
    )
    common.add_seed(d)
    common.add_seconds(
        d, "--hang", 3.0, "seconds a collective waits for its peers (default 3)"
    )
    common.add_flag(d, "--json", "machine-readable output")
    d.add_argument(
        "--dump-dir",
        default=None,
        help="keep the flight-recorder dumps and decision sidecars here",
    )
    d.add_argument(
        "--replay", default=None, metavar="SCHEDULE", help="play one schedule"
    )
    common.add_flag(
        d,
        "--watch",
        "every rank of every run (search, confirmation, soak, --replay) runs the "
        "consensus watch (log mode) beside the flight recorder; a finding it "
        "named says 'found by: watch', a soak it alarmed on fails",
    )
    d.add_argument(
        "--explain",
        default=None,
        metavar="DUMP_DIR",
        help="explain flight-recorder dumps (one file per rank)",
    )
    d.set_defaults(func=cmd_diverge)
