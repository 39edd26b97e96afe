"""``verify``: the main job. Simulated ranks (one process each, gloo over
loopback) drive the installed DSpark code and must take the same decisions:
the plugin loaded after ``torch.distributed`` is up, the startup capture
decision, the non-overlap entry, compact verify, and the draft batch under
request churn. Exit 0 when every phase agrees, 1 on a disagreement, a hang
or a crash, 2 when it cannot run."""

from __future__ import annotations

import argparse
import sys

from sglang_dspark_dp import watch_sites
from sglang_dspark_dp.cli import common
from sglang_dspark_dp.cli.common import EXIT_CANNOT, EXIT_FAIL, EXIT_OK


class _Progress:
    """Progress of the decode steps on stderr (tqdm draws it; off with
    ``--no-progress``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(
                total=total,
                unit="step",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.5 if sys.stderr.isatty() else 10.0,
            )
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _tier_rank(tier: str) -> tuple[int, str]:
    head = tier.split()[0].lstrip(">").split("-")[0]
    return (int(head) if head.isdigit() else 10**6, tier)


def render_tiers(result) -> str:
    lines = []
    dp = result.config.dp
    for ep, counter in result.tiers.items():
        lines.append(f"EP {ep} ({'on' if ep > 1 else 'off'}), {dp} DP ranks:")
        header = (
            "graph-size tier",
            "ranks idle/busy",
            "admitted/eager",
            "ranks agree",
            "steps",
        )
        rows = []
        for (tier, idle, mode, agree), n in sorted(
            counter.items(), key=lambda kv: (_tier_rank(kv[0][0]), kv[0][1], kv[0][2])
        ):
            rows.append((tier, f"{idle}/{dp - idle}", mode, agree, str(n)))
        widths = [
            max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
            for i, h in enumerate(header)
        ]
        fmt = "  " + "  ".join(f"{{:<{w}}}" for w in widths)
        lines.append(fmt.format(*header).rstrip())
        lines.append("  " + "  ".join("-" * w for w in widths))
        lines.extend(fmt.format(*r).rstrip() for r in rows)
        lines.append("")
    return "\n".join(lines)


def _process_state_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """The plugin loaded after ``torch.distributed`` is up, in ``--dp``
    ranks under DP attention: the same verdicts as a fresh process, and the
    startup decision still agreed."""
    from sglang_dspark_dp.harness import process_state
    from sglang_dspark_dp.harness.lockstep import CannotRun

    if args.no_fix:
        return EXIT_OK, ["process-state: skipped (--no-fix: the plugin is off)"]
    try:
        result = process_state.run(dp=args.dp, timeout_s=args.timeout)
    except CannotRun as exc:
        return EXIT_CANNOT, [f"process-state: cannot run: {exc}"]
    lines = [f"process-state: {result.summary()}"]
    lines.extend(f"  {d}" for d in result.differences[1:])
    return (EXIT_OK if result.ok else EXIT_FAIL), lines


def _startup_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """Every rank's draft CUDA-graph capture decision at startup, plain TP
    and DP attention of ``--dp`` ranks (and, from 4 ranks, a dense draft
    capturing on attention-TP groups of 2), one rank short of memory.
    Returns the exit status it asks for and its summary lines."""
    from sglang_dspark_dp.harness import startup

    configs = [dict(tp=args.dp, dp=1), dict(tp=args.dp, dp=args.dp)]
    if args.dp >= 4 and args.dp % 2 == 0:
        # A dense draft under DP attention with attention TP 2: its graphs
        # capture on the attention-TP groups [0, 1], [2, 3], ...
        configs.append(dict(tp=args.dp, dp=args.dp // 2, dense_draft=True))
    try:
        results = [
            startup.run_startup(
                startup.StartupConfig(
                    fix=not args.no_fix,
                    timeout_s=args.timeout,
                    watch=_WATCH_MODE if args.watch else None,
                    **c,
                )
            )
            for c in configs
        ]
    except startup.CannotRun as exc:
        return EXIT_CANNOT, [f"startup: cannot run: {exc}"]
    lines = [f"startup: {r.summary()}" for r in results]
    watch_ok = True
    if args.watch:
        for r in results:
            ok, said = startup_watch(r)
            watch_ok = watch_ok and ok
            lines.extend(f"  {line}" for line in said)
    bad = [r for r in results if not r.correct]
    if not bad:
        return (EXIT_OK if watch_ok else EXIT_FAIL), lines
    for r in bad:
        readings = ", ".join(
            f"rank {x.rank} had {x.free_gib:.2f} GiB, read "
            + ("nothing" if x.read_gib is None else f"{x.read_gib:.2f} GiB")
            + f", {x.decision}"
            for x in r.ranks
        )
        lines.append(f"  readings ({r.config.describe()}): {readings}")
    return EXIT_FAIL, lines


#: The watch's mode in the simulated worlds: ``log``, so every rank reports
#: what it said and the run goes on to show what the harness sees.
_WATCH_MODE = "log"
#: How the watch's line names each decision (its sites' names, in
#: ``watch_sites``): the startup ones (capture first; folded sampling where
#: the ranks captured alike), the compact-verify ones, the draft batch's.
_STARTUP = tuple(f"the {d} decision" for d in (watch_sites.CAPTURE, watch_sites.FOLDED))
_VERIFY = (
    watch_sites.VERIFY_BUDGET,
    watch_sites.VERIFY_BROADCAST,
    watch_sites.VERIFY_TIER,
)
_DRAFT = tuple(
    f"the {d} decision" for d in (watch_sites.DRAFT_SIZES, watch_sites.DRAFT_ADMISSION)
)
ENTRY = f"the {watch_sites.ENTRY} decision"


def startup_watch(result) -> tuple[bool, list[str]]:
    """Whether the watch said what it had to of one startup run, and its
    lines: in every capture group whose ranks disagree, every rank's line
    names a startup decision (the capture decision, or folded sampling
    where they captured alike; checked before the capture barrier: first);
    where they agree, nothing."""
    lines: list[str] = []
    ok = True
    for ranks in result.by_group():
        said = [a for r in ranks for a in r.alarms]
        if result.group_agrees(ranks):
            if said:
                ok = False
                lines.append(f"watch: FALSE ALARM: {said[0]}")
            continue
        named = [r for r in ranks if any(d in a for a in r.alarms for d in _STARTUP)]
        if len(named) == len(ranks):
            lines.append(f"watch: named it first: {ranks[0].alarms[0]}")
        else:
            ok = False
            lines.append(
                "watch: MISSED: ranks "
                + ", ".join(str(r.rank) for r in ranks if r not in named)
                + " did not name the startup decision the group parted on"
            )
    return ok, lines


def compact_watch(result) -> tuple[bool, list[str]]:
    """Whether the watch said what it had to of one compact-verify run, and
    its lines: in every group whose ranks part ways, every rank's first
    line names a verify decision at the first step they part on or
    earlier; where they agree, nothing."""
    import re

    lines: list[str] = []
    ok = True
    cfg = result.config
    for start in range(0, cfg.world, cfg.tp):
        ranks = list(range(start, start + cfg.tp))
        parted = [s for s in result.steps if s.ranks[0] == start and not s.agree]
        said = {r: result.alarms.get(r, ()) for r in ranks}
        if not parted:
            for r in ranks:
                if said[r]:
                    ok = False
                    lines.append(f"watch: FALSE ALARM: {said[r][0]}")
                    break
            continue
        first = parted[0].step
        for r in ranks:
            found = said[r][:1]
            step = re.search(r" at step (\d+):", found[0]) if found else None
            if not found or not any(d in found[0] for d in _VERIFY) or not step:
                ok = False
                lines.append(
                    f"watch: MISSED: rank {r} did not name the step-{first} divergence"
                )
                break
            if int(step.group(1)) > first:
                ok = False
                lines.append(
                    f"watch: LATE: rank {r} named step {step.group(1)}, the ranks "
                    f"parted at step {first}"
                )
                break
        else:
            lines.append(f"watch: named it first: {said[ranks[0]][0]}")
    return ok, lines


def decode_watch(result) -> tuple[bool, list[str]]:
    """What the watch said of the decode run, and whether the run stays
    good by it: a line of the watch means the ranks parted ways on a draft
    decision (every rank's first line must name one), which fails the run
    even where the harness's own checks saw nothing; a disagreement the
    harness saw that the watch did not name is MISSED. A crash or a wrong
    value every rank shares is not a divergence: the watch stays silent
    (the crash is named above)."""
    said = {r: result.alarms.get(r, ()) for r in range(result.config.world)}
    f = result.failure
    judged = f is not None and f.kind == "disagreement"
    if any(said.values()):
        for r, lines in said.items():
            if not lines or not any(d in lines[0] for d in _DRAFT):
                return False, [
                    f"watch: MISSED: rank {r} did not name the draft decision the "
                    "ranks parted on"
                ]
        how = "named it first" if judged else "named what the harness does not judge"
        return False, [f"watch: {how}: {said[0][0]}"]
    if judged:
        return False, [
            f"watch: MISSED: no rank named the draft decision the ranks parted on "
            f"at step {f.step} (EP {f.ep})"
        ]
    if f is not None:
        return True, [
            f"watch: silent: the ranks did not part ways ({f.kind} at step {f.step} "
            "on the ranks alike, named above)"
        ]
    return True, []


def entry_watch(result) -> tuple[bool, list[str]]:
    """What the watch said of the ranks' non-overlap steps: nothing where
    every rank's steps reached the worker, silent where they were refused
    alike (the crash is named above); where the ranks' steps went apart, a
    line naming the worker step entry; anything else fails."""
    reports = result.reports
    errors = result.errors()
    if errors:
        rank = min(errors)
        return False, [f"watch: rank {rank} failed: {errors[rank].splitlines()[-1]}"]
    lines = result.alarms()
    went = {r: tuple(s["reached"] for s in rep["steps"]) for r, rep in reports.items()}
    alike = len(set(went.values())) == 1
    if alike and not lines:
        if all(all(v) for v in went.values()):
            return True, []
        return True, ["watch: silent: every rank's steps were refused alike (above)"]
    if alike:
        return False, [f"watch: FALSE ALARM: {lines[0]}"]
    named = [line for line in lines if ENTRY in line]
    if not named:
        return False, ["watch: MISSED: the ranks' steps went apart, and no line"]
    return False, [f"watch: named it first: {named[0]}"]


def _non_overlap_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """One prefill and one decode step through the installed scheduler with
    the overlap schedule off, to the DSpark worker; stock or repaired. With
    ``--watch``, on ``--dp`` ranks (gloo, two TP groups where they split
    evenly), the watch on."""
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.srt.managers import scheduler as entry

    if args.watch:
        return _non_overlap_ranks(args)
    repair = entry.REPAIR
    if args.no_fix:
        repair.uninstrument()
    else:
        repair.instrument(apply=True)
    try:
        result = entry.probe()
    except DidNotEnable as exc:
        return EXIT_CANNOT, [f"non-overlap: cannot run: {exc}"]
    how = "stock SGLang" if args.no_fix else "plugin on"
    if result.reaches:
        return EXIT_OK, [
            "non-overlap: with --disable-overlap-schedule, prefill and decode "
            f"steps reach DSparkWorkerV2.forward_batch_generation ({how})"
        ]
    return EXIT_FAIL, [
        "non-overlap: with --disable-overlap-schedule every step crashes: "
        f"{result.describe()} ({how}; SGLang #39262)"
    ]


def _side_by_side(dp: int, max_world: int) -> tuple[int, int]:
    """``(world, groups)``: ``dp`` ranks (at most ``max_world``) as two TP
    groups side by side where they split evenly (the second group's first
    rank is not rank 0), else one group."""
    world = min(dp, max_world)
    return world, 2 if world >= 4 and world % 2 == 0 else 1


def _non_overlap_ranks(args: argparse.Namespace) -> tuple[int, list[str]]:
    from sglang_dspark_dp.harness import entry

    world, groups = _side_by_side(args.dp, entry.MAX_WORLD)
    try:
        result = entry.run_entry(
            entry.EntryConfig(
                tp=world // groups,
                groups=groups,
                decode_steps=1,
                fix=not args.no_fix,
                watch=_WATCH_MODE,
                timeout_s=args.timeout,
            )
        )
    except entry.CannotRun as exc:
        return EXIT_CANNOT, [f"non-overlap: cannot run: {exc}"]
    how = "stock SGLang" if args.no_fix else "plugin on"
    steps = [s for rep in result.reports.values() for s in rep["steps"]]
    refused = sorted({s["error"] for s in steps if s["error"]})
    if steps and not refused and all(s["reached"] for s in steps):
        line = (
            f"non-overlap: {world} ranks, with --disable-overlap-schedule, prefill "
            f"and decode steps reach DSparkWorkerV2.forward_batch_generation ({how})"
        )
        status = EXIT_OK
    else:
        line = (
            f"non-overlap: {world} ranks, with --disable-overlap-schedule every step "
            f"crashes: {'; '.join(refused) or 'no step ran'} ({how}; SGLang #39262)"
        )
        status = EXIT_FAIL
    ok, said = entry_watch(result)
    if not ok:
        status = EXIT_FAIL
    return status, [line, *(f"  {x}" for x in said)]


def _compact_verify_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """The verify graph tier of a budget-scheduling ragged verify mode on
    ``--dp`` plain-TP ranks (gloo, the installed planner, two TP groups where
    they split evenly): confidence drift and a late confidence relay, stock
    or repaired."""
    from sglang_dspark_dp.harness import compact_verify

    world, groups = _side_by_side(args.dp, compact_verify.MAX_WORLD)
    try:
        results = compact_verify.run_scenarios(
            fix=not args.no_fix,
            tp=world // groups,
            groups=groups,
            steps=min(args.steps, 40),
            seed=args.seed,
            timeout_s=args.timeout,
            watch=_WATCH_MODE if args.watch else None,
        )
    except compact_verify.CannotRun as exc:
        return EXIT_CANNOT, [f"compact-verify: cannot run: {exc}"]
    lines = []
    watch_ok = True
    for r in results:
        lines.append(f"compact-verify: {r.summary()}")
        if args.watch:
            ok, said = compact_watch(r)
            watch_ok = watch_ok and ok
            lines.extend(f"  {line}" for line in said)
    good = all(r.agree for r in results) and watch_ok
    return (EXIT_OK if good else EXIT_FAIL), lines


#: The phases before the decode phase: name, runner, what a failure means.
_PHASES = (
    (
        "process-state",
        _process_state_phase,
        "the plugin decides differently, or the ranks' startup decisions diverge, "
        "when it loads after torch.distributed is up (see the process-state line "
        "above)",
    ),
    (
        "startup",
        _startup_phase,
        "the ranks' startup capture decisions diverge (see the startup lines above)",
    ),
    (
        "non-overlap",
        _non_overlap_phase,
        "with --disable-overlap-schedule the scheduler's call to the DSpark worker "
        "raises (see the non-overlap line above)",
    ),
    (
        "compact-verify",
        _compact_verify_phase,
        "the ranks' compact-verify graph tiers diverge (see the compact-verify "
        "lines above)",
    ),
)


def cmd_verify(args: argparse.Namespace) -> int:
    common.quiet_sglang()
    if common.load_api() is None:  # no DSpark: one line, exit 2, first
        return EXIT_CANNOT
    failed: list[str] = []
    for name, phase, meaning in _PHASES:
        if name == "startup":
            if args.no_startup:
                continue
            print(
                f"verify: startup: draft CUDA-graph capture decision of {args.dp} "
                "simulated ranks (gloo, CPU), plain TP and DP attention, one rank "
                f"short of memory, {'stock SGLang' if args.no_fix else 'plugin on'}",
                flush=True,
            )
        status, lines = phase(args)
        for line in lines:
            print(line, flush=True)
        if status == EXIT_CANNOT:
            common.err(lines[-1])
            return EXIT_CANNOT
        if status != EXIT_OK:
            failed.append(meaning)
    status = _decode_phase(args)
    if status == EXIT_CANNOT:
        return status
    for meaning in failed:
        print(f"verify: FAILED: {meaning}")
        status = EXIT_FAIL
    return status


def _decode_phase(args: argparse.Namespace) -> int:
    from sglang_dspark_dp.expectations import KNOWN_CRASH
    from sglang_dspark_dp.harness import lockstep

    ep_sizes = (args.dp,) if args.ep else (1, args.dp)
    cfg = lockstep.RunConfig(
        dp=args.dp,
        ep_sizes=ep_sizes,
        steps=args.steps,
        seed=args.seed,
        fix=not args.no_fix,
        port=args.port,
        timeout_s=args.timeout,
        watch=_WATCH_MODE if args.watch else None,
    )
    bar = _Progress(enabled=not args.no_progress)
    print(
        f"verify: {cfg.dp} simulated DP ranks (gloo, CPU), {cfg.steps} decode steps "
        f"per EP tier, EP {' and '.join(map(str, ep_sizes))}, seed {cfg.seed}, "
        f"{'stock SGLang (--no-fix)' if args.no_fix else 'plugin on'}",
        flush=True,
    )
    try:
        result = lockstep.run(cfg, on_progress=bar)
    except lockstep.CannotRun as exc:
        bar.close()
        return common.cannot(exc)
    except KeyboardInterrupt:
        bar.close()
        common.err("interrupted")
        return EXIT_CANNOT
    bar.close()
    print()
    print(render_tiers(result))
    watch_ok = True
    if args.watch:
        watch_ok, said = decode_watch(result)
        for line in said:
            print(f"  {line}")
    done = sum(result.steps_done.values())
    head = (
        f"sglang {result.sglang_version}, plugin {result.plugin}; sync sizes "
        f"written by {result.sync_writer}"
    )
    if result.failure is None:
        print(
            f"verify: {'OK' if watch_ok else 'the checks passed'}: {cfg.dp} DP ranks agreed on admission, graph size, padded "
            f"tokens and EP accounting at all {done} steps ({head}, "
            f"{result.seconds:.0f} s)"
        )
        if watch_ok:
            return EXIT_OK
        print(
            "verify: FAILED: the watch saw the ranks part ways on a draft decision "
            "(see the watch line above)"
        )
        return EXIT_FAIL
    f = result.failure
    if f.kind == "crash" and KNOWN_CRASH in f.detail:
        print(
            "verify: FAILED: stock DSpark crashes under DP attention: its hand-built "
            "draft batch has no original_global_num_tokens_cpu, so "
            "DecodeCudaGraphRunner.can_run_graph fails with "
            f'"TypeError: {KNOWN_CRASH}" '
            f"(step {f.step}, EP {f.ep}, DP rank {f.rank}; {head}). "
            "Install or enable the plugin to repair it."
        )
    else:
        print(f"verify: FAILED: {f.render()} ({head}; {done} steps passed before it)")
    return EXIT_FAIL


def add_parser(sub: argparse._SubParsersAction) -> None:
    v = sub.add_parser("verify", help="simulate DP ranks and check lockstep (main job)")
    common.add_dp(v, 4, "simulated DP ranks, 2-16 (default 4)")
    common.add_flag(v, "--ep", "EP on only (EP size = --dp); default: EP off, then on")
    common.add_steps(v, 2000)
    common.add_seed(v)
    common.add_flag(
        v,
        "--no-fix",
        "run stock SGLang (shows the upstream crash on affected releases)",
    )
    common.add_int(
        v,
        "--port",
        0,
        65535,
        0,
        "loopback port for the gloo group (default: a free one)",
    )
    common.add_seconds(
        v, "--timeout", 60.0, "seconds any collective may wait (default 60)"
    )
    common.add_flag(v, "--no-progress")
    common.add_flag(
        v,
        "--no-startup",
        "skip the startup phase (the draft CUDA-graph capture decision)",
    )
    common.add_flag(
        v,
        "--watch",
        "run every simulated world (startup, the non-overlap entry on --dp "
        "ranks, compact verify, the decode steps) "
        "with the consensus watch on (log mode): each divergence must be named "
        "first by the watch's line, and where the ranks agree the watch must "
        "stay silent",
    )
    v.set_defaults(func=cmd_verify)
