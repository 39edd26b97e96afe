"""The consensus watch with the plugin on: zero alarms over many steps.

Runs the compact-verify harness (plain TP, both scenarios: ``drift`` on the
non-overlap path, ``late`` on the overlap path) for ``--steps`` decode steps
at each rank count, the DP-attention draft steps (the lockstep harness,
EP off then on, ``--steps`` each: the draft batch's DP sync sizes and
graph admission), and the startup harness at each rank count in both
layouts (plain TP, DP attention with attention TP 1), every rank with the
plugin's repairs and the watch in ``log`` mode, so an alarm is counted
rather than ending the rank. Prints one row per run: its ranks, steps,
alarms, whether the ranks agreed and completed, and its seconds. Exits 1
if any run alarmed or did not complete, 2 on bad input.

On a machine with fewer cores than ranks the ranks share cores; that
slows the run, never the verdict.

Usage::

    python scripts/watch_soak.py --ranks 2 4 8 --steps 2000
"""

from __future__ import annotations

import argparse
import sys
import time


def _row(
    kind: str,
    ranks: int,
    steps: int,
    result,
    alarms: list[str],
    *,
    agree: bool | None = None,
    complete: bool | None = None,
) -> list[str]:
    if agree is None:
        agree = result.agree
    if complete is None:
        complete = getattr(result, "complete", not getattr(result, "hung", False))
    return [
        kind,
        str(ranks),
        str(steps),
        str(len(alarms)),
        "yes" if agree else "no",
        "yes" if complete else "no",
        f"{result.seconds:.0f}",
    ]


def run(
    ranks: list[int], steps: int, fix: bool = True
) -> tuple[list[list[str]], list[str]]:
    from sglang_dspark_dp.harness import compact_verify, lockstep, startup

    rows, alarms_all = [], []
    for n in ranks:
        for scenario in (compact_verify.DRIFT, compact_verify.LATE):
            t0 = time.monotonic()
            result = compact_verify.run_compact_verify(
                compact_verify.CompactConfig(
                    scenario=scenario,
                    tp=n,
                    groups=1,
                    steps=steps,
                    fix=fix,
                    watch="log",
                    timeout_s=max(120.0, steps * 0.5),
                )
            )
            alarms = [a for lines in result.alarms.values() for a in lines]
            alarms_all += alarms
            rows.append(_row(f"compact verify ({scenario})", n, steps, result, alarms))
            print(f"  done: {rows[-1]} in {time.monotonic() - t0:.0f} s", flush=True)
        t0 = time.monotonic()
        ep_sizes = (1, n)
        try:
            draft = lockstep.run(
                lockstep.RunConfig(
                    dp=n, ep_sizes=ep_sizes, steps=steps, fix=fix, watch="log"
                )
            )
        except lockstep.CannotRun as exc:  # a rank died (stock 0.5.16's crash)
            rows.append(["draft steps, DP attention", str(n), str(steps), "0"])
            rows[-1] += ["no", "no", f"{time.monotonic() - t0:.0f}"]
            print(f"  done: {rows[-1]} ({exc})", flush=True)
        else:
            alarms = [a for lines in draft.alarms.values() for a in lines]
            alarms_all += alarms
            done = sum(draft.steps_done.values()) == steps * len(ep_sizes)
            rows.append(
                _row(
                    "draft steps, DP attention",
                    n,
                    steps,
                    draft,
                    alarms,
                    agree=draft.healthy,
                    complete=done,
                )
            )
            print(f"  done: {rows[-1]}", flush=True)
        for dp in (1, n):
            result = startup.run_startup(
                startup.StartupConfig(
                    tp=n, dp=dp, fix=fix, watch="log", timeout_s=120.0
                )
            )
            alarms = [a for r in result.ranks for a in r.alarms]
            alarms_all += alarms
            layout = "startup, DP attention" if dp > 1 else "startup, plain TP"
            rows.append(_row(layout, n, 1, result, alarms))
            print(f"  done: {rows[-1]}", flush=True)
    return rows, alarms_all


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument(
        "--no-fix",
        dest="fix",
        action="store_false",
        help="stock SGLang (the repairs off): the known defects must alarm",
    )
    args = p.parse_args(argv)
    bad = [n for n in args.ranks if not 2 <= n <= 8]
    if bad:
        print(
            f"watch_soak: --ranks must be between 2 and 8, got {bad}", file=sys.stderr
        )
        return 2
    if args.steps < 1:
        print(
            f"watch_soak: --steps must be at least 1, got {args.steps}", file=sys.stderr
        )
        return 2
    rows, alarms = run(args.ranks, args.steps, args.fix)
    head = ["run", "ranks", "steps", "alarms", "agree", "complete", "s"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    for line in alarms[:5]:
        print(f"alarm: {line}")
    ok = not alarms and all(r[4] == "yes" and r[5] == "yes" for r in rows)
    print("watch_soak: " + ("no alarm" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
