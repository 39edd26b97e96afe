"""``judge``: the installed SGLang build alone (plugin off), judged by
behaviour, one verdict per upstream change: ``in this build``, ``not in
this build: <what stock does>`` or ``not affected: <why the defect's code
is absent>``. For maintainers who cherry-pick upstream changes onto a
release branch. Exit 0 when every change named is in the build or does not
affect it, 1 when one is missing, 2 when the build cannot be judged."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

from sglang_dspark_dp.cli import common
from sglang_dspark_dp.cli.common import EXIT_CANNOT, EXIT_FAIL, EXIT_OK


def _combine(verdict: Any, ok: bool, text: str) -> Any:
    """The probe's verdict with what a run of simulated ranks measured: a
    run that fails makes the change ``not in this build`` whatever the
    probe said."""
    from sglang_dspark_dp.upstream import State, Verdict

    if ok:
        return Verdict(verdict.key, verdict.state, f"{verdict.evidence}; {text}")
    if verdict.state is State.NOT_IN:
        return Verdict(verdict.key, State.NOT_IN, f"{verdict.evidence}; {text}")
    return Verdict(verdict.key, State.NOT_IN, f"{text} (probe: {verdict.evidence})")


def _lockstep(args: argparse.Namespace, verdict: Any) -> Any:
    from sglang_dspark_dp.expectations import KNOWN_CRASH
    from sglang_dspark_dp.harness import lockstep

    cfg = lockstep.RunConfig(
        dp=args.dp,
        ep_sizes=(1, args.dp),
        steps=args.steps,
        seed=args.seed,
        fix=False,
        timeout_s=args.timeout,
    )
    result = lockstep.run(cfg)
    f = result.failure
    if f is None:
        done = sum(result.steps_done.values())
        return _combine(
            verdict, True, f"{args.dp} DP ranks agreed for {done} steps, EP off and on"
        )
    if f.kind == "crash" and KNOWN_CRASH in f.detail:
        text = (
            "stock DSpark crashes under DP attention "
            f'("TypeError: {KNOWN_CRASH}" in can_run_graph, step {f.step}, '
            f"DP rank {f.rank})"
        )
    else:
        text = f"the simulated DP ranks failed: {f.render()}"
    return _combine(verdict, False, text)


def _startup(dp_attention: bool) -> Callable[[argparse.Namespace, Any], Any]:
    def measure(args: argparse.Namespace, verdict: Any) -> Any:
        from sglang_dspark_dp.harness import startup

        topology = (args.dp, args.dp if dp_attention else 1)
        (result,) = startup.run_matrix(
            fix=False, topologies=(topology,), timeout_s=args.timeout
        )
        if result.correct:
            return _combine(verdict, True, result.summary())
        return _combine(
            verdict, False, f"{result.config.describe()}: {result.divergence}"
        )

    return measure


def _drift(args: argparse.Namespace, verdict: Any) -> Any:
    from sglang_dspark_dp.harness import compact_verify

    (result,) = compact_verify.run_scenarios(
        fix=False,
        scenarios=(compact_verify.DRIFT,),
        tp=min(args.dp, compact_verify.MAX_WORLD),
        steps=min(args.steps, 40),
        seed=args.seed,
        timeout_s=args.timeout,
    )
    return _combine(verdict, result.agree, result.summary())


#: Changes a run of simulated ranks measures, besides the probe.
MEASURED: dict[str, Callable[[argparse.Namespace, Any], Any]] = {
    "dp-draft-metadata": _lockstep,
    "spec-tp-sync": _startup(dp_attention=False),
    "capture-group-memory": _startup(dp_attention=True),
    "verify-budget-broadcast": _drift,
}


def repair_groups() -> dict[str, tuple[str, ...]]:
    """Each repair's name and the changes it stands in for (``--fixes``
    takes a repair's name for all of them)."""
    from sglang_dspark_dp import registry

    return {name: registry.repair(name).stands_in_for for name in registry.names()}


def judge(args: argparse.Namespace, keys: list[str]) -> list[tuple[Any, str]]:
    """One verdict per change in ``keys``, the plugin off, with the repair
    that judged it (the one that stands in for it on this release). Raises
    DidNotEnable (or the harnesses' CannotRun) where it cannot judge."""
    from sglang_dspark_dp import registry
    from sglang_dspark_dp.outcome import DidNotEnable

    registry.uninstrument()  # the build alone, whatever was loaded
    found: dict[str, Any] = {}
    for name in registry.names():
        repair = registry.repair(name)
        if not set(repair.stands_in_for) & set(keys):
            continue
        for verdict in repair.stock_verdicts():
            found.setdefault(verdict.key, (verdict, name))
    out = []
    for key in keys:
        if key not in found:
            raise DidNotEnable(f"no probe could judge {key} on this build")
        verdict, name = found[key]
        measure = MEASURED.get(key)
        out.append((verdict if measure is None else measure(args, verdict), name))
    return out


def cmd_judge(args: argparse.Namespace) -> int:
    common.quiet_sglang()
    from sglang_dspark_dp import upstream
    from sglang_dspark_dp.harness.lockstep import CannotRun
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version

    groups = repair_groups()
    try:
        keys = upstream.resolve(args.fixes, groups)
    except ValueError as exc:
        return common.cannot(exc, "--fixes")
    if common.load_api() is None:
        return EXIT_CANNOT
    labels = ", ".join(upstream.change(k).label for k in keys)
    if not args.json:
        print(
            f"judge: sglang {installed_sglang_version()}, plugin off: judging this "
            f"build by behaviour, per upstream change ({labels})",
            flush=True,
        )
    try:
        judged = judge(args, keys)
    except (CannotRun, DidNotEnable) as exc:
        return common.cannot(exc)
    verdicts = [v for v, _ in judged]
    missing = [v for v in verdicts if not v.state.ok]
    if args.json:
        print(json.dumps([dict(v.as_dict(), repair=r) for v, r in judged], indent=2))
        return EXIT_FAIL if missing else EXIT_OK
    for v in verdicts:
        print(f"judge: {v.line()}", flush=True)
    if missing:
        standing = sorted({r for v, r in judged if not v.state.ok})
        print(
            f"judge: FAILED: {len(missing)} of {len(verdicts)} changes not in this "
            f"build ({', '.join(v.change.label for v in missing)}); the "
            f"sglang-dspark-dp plugin stands in for them ({', '.join(standing)})"
        )
        return EXIT_FAIL
    print("judge: OK: every change judged is in this build or does not affect it")
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    from sglang_dspark_dp import upstream

    j = sub.add_parser(
        "judge",
        help="judge this SGLang build alone (plugin off), per upstream change",
    )
    j.add_argument(
        "--fixes",
        default=",".join(upstream.keys()),
        help=(
            "comma-separated upstream changes to judge: names, PR or issue "
            "numbers (33098 or #33098), or a repair's name for every change it "
            f"stands in for (default: all: {', '.join(upstream.keys())})"
        ),
    )
    common.add_dp(j, 2)
    common.add_steps(j, 200)
    common.add_seed(j)
    common.add_seconds(j, "--timeout", 60.0)
    common.add_flag(j, "--json", "the verdicts as JSON")
    j.set_defaults(func=cmd_judge)
