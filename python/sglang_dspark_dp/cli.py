"""``sglang-dspark-dp``: verify, doctor, repro.

* ``verify``  the main job: simulated DP ranks (one process each, gloo over
  loopback) drive the real DSpark draft builder under request churn and check
  that they stay in lockstep. Exit 0 healthy, 1 disagreement or crash, 2
  cannot run.
* ``doctor``  is the installed SGLang healthy, and what did the plugin do?
* ``repro``   one DP step on stock SGLang and with the repair, side by side.
* ``judge``   the installed SGLang build alone (plugin off), judged by
  behaviour: does it carry each fix the plugin would otherwise make? For
  maintainers who backport a fix onto a release branch.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2


def _err(msg: str) -> None:
    print(f"sglang-dspark-dp: {msg}", file=sys.stderr)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one clear line
        self.print_usage(sys.stderr)
        _err(message)
        raise SystemExit(EXIT_CANNOT)


def _int_arg(name: str, lo: int | None = None, hi: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer, got {text!r}"
            ) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {span}, got {value}")
        return value

    return parse


def _quiet_sglang() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


# --------------------------------------------------------------------------
# verify
# --------------------------------------------------------------------------


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


def _startup_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """Every rank's draft CUDA-graph capture decision at startup, plain TP
    and DP attention of ``--dp`` ranks, one rank short of memory. Returns
    the exit status it asks for and its summary lines."""
    from sglang_dspark_dp.harness import startup

    topologies = ((args.dp, 1), (args.dp, args.dp))
    try:
        results = startup.run_matrix(
            fix=not args.no_fix, topologies=topologies, timeout_s=args.timeout
        )
    except startup.CannotRun as exc:
        return EXIT_CANNOT, [f"startup: cannot run: {exc}"]
    lines = [f"startup: {r.summary()}" for r in results]
    bad = [r for r in results if not r.correct]
    if not bad:
        return EXIT_OK, lines
    for r in bad:
        readings = ", ".join(
            f"rank {x.rank} had {x.free_gib:.2f} GiB, read "
            + ("nothing" if x.read_gib is None else f"{x.read_gib:.2f} GiB")
            + f", {x.decision}"
            for x in r.ranks
        )
        lines.append(f"  readings ({r.config.describe()}): {readings}")
    return EXIT_FAIL, lines


def _non_overlap_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """One prefill and one decode step through the installed scheduler with
    the overlap schedule off, to the DSpark worker; stock or repaired."""
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.srt.managers import scheduler as entry

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


def _compact_verify_phase(args: argparse.Namespace) -> tuple[int, list[str]]:
    """The verify graph tier of a budget-scheduling ragged verify mode on
    ``--dp`` plain-TP ranks (gloo, the installed planner): confidence drift
    and a late confidence relay, stock or repaired."""
    from sglang_dspark_dp.harness import compact_verify

    try:
        results = compact_verify.run_scenarios(
            fix=not args.no_fix,
            tp=min(args.dp, compact_verify.MAX_WORLD),
            steps=min(args.steps, 40),
            seed=args.seed,
            timeout_s=args.timeout,
        )
    except compact_verify.CannotRun as exc:
        return EXIT_CANNOT, [f"compact-verify: cannot run: {exc}"]
    lines = [f"compact-verify: {r.summary()}" for r in results]
    return (EXIT_OK if all(r.agree for r in results) else EXIT_FAIL), lines


def cmd_verify(args: argparse.Namespace) -> int:
    _quiet_sglang()
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.outcome import DidNotEnable

    try:
        adapter.load_sglang_api()  # no DSpark: one line, exit 2, first
    except DidNotEnable as exc:
        _err(f"cannot run: {exc}")
        return EXIT_CANNOT
    startup_status, startup_lines = EXIT_OK, []
    if not args.no_startup:
        print(
            f"verify: startup: draft CUDA-graph capture decision of {args.dp} "
            "simulated ranks (gloo, CPU), plain TP and DP attention, one rank "
            f"short of memory, {'stock SGLang' if args.no_fix else 'plugin on'}",
            flush=True,
        )
        startup_status, startup_lines = _startup_phase(args)
        for line in startup_lines:
            print(line, flush=True)
        if startup_status == EXIT_CANNOT:
            _err(startup_lines[-1])
            return EXIT_CANNOT
    entry_status, entry_lines = _non_overlap_phase(args)
    for line in entry_lines:
        print(line, flush=True)
    if entry_status == EXIT_CANNOT:
        _err(entry_lines[-1])
        return EXIT_CANNOT
    budget_status, budget_lines = _compact_verify_phase(args)
    for line in budget_lines:
        print(line, flush=True)
    if budget_status == EXIT_CANNOT:
        _err(budget_lines[-1])
        return EXIT_CANNOT
    status = _decode_phase(args)
    if status == EXIT_CANNOT:
        return status
    if startup_status != EXIT_OK:
        print(
            "verify: FAILED: the ranks' startup capture decisions diverge "
            "(see the startup lines above)"
        )
        status = EXIT_FAIL
    if entry_status != EXIT_OK:
        print(
            "verify: FAILED: with --disable-overlap-schedule the scheduler's call "
            "to the DSpark worker raises (see the non-overlap line above)"
        )
        status = EXIT_FAIL
    if budget_status != EXIT_OK:
        print(
            "verify: FAILED: the ranks' compact-verify graph tiers diverge (see "
            "the compact-verify lines above)"
        )
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
        _err(f"cannot run: {exc}")
        return EXIT_CANNOT
    except KeyboardInterrupt:
        bar.close()
        _err("interrupted")
        return EXIT_CANNOT
    bar.close()
    print()
    print(render_tiers(result))
    done = sum(result.steps_done.values())
    head = (
        f"sglang {result.sglang_version}, plugin {result.plugin}; sync sizes "
        f"written by {result.sync_writer}"
    )
    if result.failure is None:
        print(
            f"verify: OK: {cfg.dp} DP ranks agreed on admission, graph size, padded "
            f"tokens and EP accounting at all {done} steps ({head}, "
            f"{result.seconds:.0f} s)"
        )
        return EXIT_OK
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


# --------------------------------------------------------------------------
# doctor
# --------------------------------------------------------------------------


def doctor_report() -> dict[str, Any]:
    from importlib import metadata

    from sglang_dspark_dp import adapter, registry
    from sglang_dspark_dp.outcome import DidNotEnable, Outcome
    from sglang_dspark_dp.package import (
        _instruments,
        installed_sglang_version,
        version_supported,
    )
    from sglang_dspark_dp.plugin import ENTRY_POINT, PLUGIN_GROUP, PLUGIN_NAME
    from sglang_dspark_dp.srt.speculative.dspark_dp_guard import guard_enabled

    version = installed_sglang_version()
    report: dict[str, Any] = {
        "sglang_version": version,
        "supported_range": list(_instruments),
        "in_supported_range": bool(version and version_supported(version)),
        "dspark_present": False,
        "entry_point_registered": False,
        "plugin_loaded": False,
        "bug_detected": None,
        "missing_fields": {},
        "repair_applied": False,
        "repair": None,
        "reason": None,
        "guard": guard_enabled(),
        "repairs": [],
    }
    eps = metadata.entry_points(group=PLUGIN_GROUP)
    report["entry_point_registered"] = any(
        ep.name == PLUGIN_NAME and ep.value == ENTRY_POINT for ep in eps
    )
    if version is None:
        report["reason"] = "sglang is not installed"
        return report
    try:
        adapter.load_sglang_api()
        report["dspark_present"] = True
    except DidNotEnable as exc:
        report["reason"] = str(exc)
        return report
    try:
        from sglang.srt.plugins import load_plugins

        load_plugins()
    except Exception as exc:  # report, never crash
        report["reason"] = f"load_plugins() failed: {exc}"
    statuses = registry.status()
    loaded = any(s.outcome is not Outcome.NOT_INSTRUMENTED for s in statuses)
    report["plugin_loaded"] = loaded
    if not loaded and report["reason"] is None:
        if not report["entry_point_registered"]:
            why = "the entry point is not registered (reinstall the package)"
        elif not _whitelisted(PLUGIN_GROUP, PLUGIN_NAME):
            why = (
                f"SGLANG_PLUGINS={os.environ.get('SGLANG_PLUGINS')!r} "
                f"does not list {PLUGIN_NAME}"
            )
        else:
            why = "load_plugins() did not call it"
        report["reason"] = f"not loaded: {why}"
    report["repairs"] = [s.as_dict() for s in statuses]
    draft = registry.repair("draft-batch")
    try:
        found = draft.probe_result or _probe_draft(draft)
    except DidNotEnable as exc:
        report["reason"] = report["reason"] or str(exc)
        return report
    report["bug_detected"] = found.affected
    report["missing_fields"] = {
        "dp_attention_path": list(found.missing_dp),
        "attention_tp_path": list(found.missing_local),
    }
    report["repair_applied"] = draft.instrumented
    if draft.plan is not None:
        report["repair"] = draft.plan.describe()
        report["guard"] = draft.plan.guard
    if report["reason"] is None:
        report["reason"] = draft.status().reason
    return report


def _probe_draft(draft) -> Any:
    from importlib import import_module

    return import_module(type(draft).__module__).probe()


def _whitelisted(group: str, name: str) -> bool:
    """Whether SGLang's own plugin discovery (its ``SGLANG_PLUGINS``
    whitelist) admits ``name``."""
    try:
        from sglang.srt.plugins import load_plugins_by_group
    except ImportError:
        return True
    try:
        return name in load_plugins_by_group(group)
    except Exception:
        return True


def cmd_doctor(args: argparse.Namespace) -> int:
    _quiet_sglang()
    report = doctor_report()
    if args.json:
        print(json.dumps(report, indent=2))
    else:

        def yn(v):
            return "yes" if v else ("unknown" if v is None else "no")

        missing = report["missing_fields"] or {}
        rows = [
            (
                "SGLang",
                f"{report['sglang_version'] or 'not installed'}"
                f" (supported: {', '.join(report['supported_range'])})",
            ),
            ("DSpark present", yn(report["dspark_present"])),
            ("entry point registered", yn(report["entry_point_registered"])),
            ("plugin loaded", yn(report["plugin_loaded"])),
            ("bug detected (probe)", yn(report["bug_detected"])),
            (
                "  DP-attention path missing",
                ", ".join(missing.get("dp_attention_path", [])) or "-",
            ),
            (
                "  attention-TP path missing",
                ", ".join(missing.get("attention_tp_path", [])) or "-",
            ),
        ]
        for st in report["repairs"]:
            rows.append((f"repair {st['repair']}", f"{st['outcome']}: {st['reason']}"))
        if not report["repairs"]:
            rows.append(("repairs", report["reason"] or "-"))
        rows.append(("draft-batch plan", report["repair"] or "-"))
        rows.append(
            ("guard (SGLANG_DSPARK_DP_CHECK)", "on" if report["guard"] else "off")
        )
        w = max(len(k) for k, _ in rows)
        for k, v in rows:
            print(f"{k:<{w}}  {v}")
    if not report["dspark_present"]:
        return EXIT_CANNOT
    healthy = report["plugin_loaded"] and all(
        st["outcome"] in ("enabled", "not needed") for st in report["repairs"]
    )
    return EXIT_OK if healthy else EXIT_FAIL


# --------------------------------------------------------------------------
# repro
# --------------------------------------------------------------------------


def cmd_repro(args: argparse.Namespace) -> int:
    _quiet_sglang()
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH, MAX_CAPTURE_BS
    from sglang_dspark_dp.drivers.draft import DraftDriver
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version
    from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
        DraftDPFieldNames,
    )
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    try:
        api = adapter.load_sglang_api()
    except DidNotEnable as exc:
        _err(f"cannot run: {exc}")
        return EXIT_CANNOT
    dp, gamma = args.dp, DRAFT_WIDTH
    counts = [3 if r % 2 == 0 else 0 for r in range(dp)]
    capture = adapter.capture_sizes(MAX_CAPTURE_BS)
    print(
        f"sglang {installed_sglang_version()}: one decode step, {dp} DP ranks, EP {dp}, "
        f"per-rank requests {counts}, draft block width {gamma}\n"
    )
    names = DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)

    def step(label: str) -> bool:
        graph = adapter.graph_runner(api, dp_size=dp, width=gamma, capture_bs=capture)
        print(f"--- {label}")
        ok = True
        for rank in range(dp):
            with adapter.parallel_override(
                api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=dp
            ):
                driver = DraftDriver(
                    api, gamma=gamma, dp_moe_sync=True, graph=graph, names=names
                )
                path = "busy" if counts[rank] else "idle"
                try:
                    seen = driver.step(counts[rank], counts)
                except Exception as exc:
                    print(
                        f"  rank {rank} ({path}): CRASH in can_run_graph: "
                        f"{type(exc).__name__}: {exc}"
                    )
                    ok = False
                    continue
                f = seen.fields
                dev = f.get("non_padded")
                dev_s = (
                    "None"
                    if dev is None
                    else f"{dev.value} ({str(dev.dtype).replace('torch.', '')}, "
                    f"{dev.device})"
                )
                print(
                    f"  rank {rank} ({path}): graph={'yes' if seen.admitted else 'no'}  "
                    f"original_global_num_tokens_cpu={f.get('unscaled')}  "
                    f"global_num_tokens_cpu={f.get('scaled_cpu')}  "
                    f"num_token_non_padded={dev_s}  "
                    f"num_token_non_padded_cpu={f.get('non_padded_cpu')}"
                )
        print()
        return ok

    REPAIR.uninstrument()
    stock_ok = step("stock SGLang (no plugin)")
    st = REPAIR.instrument(apply=True)
    if not st.healthy:
        _err(f"the repair cannot apply: {st.reason}")
        return EXIT_CANNOT
    fixed_ok = step(f"with sglang-dspark-dp ({REPAIR.plan.describe()})")
    print(
        f"stock: {'ok' if stock_ok else 'crashes'}; "
        f"with the plugin: {'ok' if fixed_ok else 'crashes'}"
    )
    return EXIT_OK if fixed_ok else EXIT_FAIL


# --------------------------------------------------------------------------
# judge
# --------------------------------------------------------------------------

#: The fixes ``judge`` can look for, by the name of the repair that makes them.
JUDGED = ("draft-batch", "startup-capture", "non-overlap-entry", "verify-budget")


def _judge_draft_batch(args: argparse.Namespace) -> tuple[bool, str]:
    from sglang_dspark_dp.expectations import KNOWN_CRASH
    from sglang_dspark_dp.harness import lockstep
    from sglang_dspark_dp.srt.speculative.dspark_components import dspark_draft

    found = dspark_draft.probe()
    problems = []
    if found.missing_dp:
        problems.append(
            "the DP-attention draft batch misses " + ", ".join(found.missing_dp)
        )
    if found.missing_local:
        problems.append(
            "the attention-TP draft batch misses " + ", ".join(found.missing_local)
        )
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
    if f is not None:
        if f.kind == "crash" and KNOWN_CRASH in f.detail:
            problems.append(
                "stock DSpark crashes under DP attention "
                f'("TypeError: {KNOWN_CRASH}" in can_run_graph, step {f.step}, '
                f"DP rank {f.rank})"
            )
        else:
            problems.append(f"the simulated DP ranks failed: {f.render()}")
    note = " (its DP fill waits for the GPU at every step)" if found.blocking else ""
    done = sum(result.steps_done.values())
    if problems:
        return False, "; ".join(problems)
    return True, f"{args.dp} DP ranks agreed for {done} steps, EP off and on{note}"


def _judge_startup_capture(args: argparse.Namespace) -> tuple[bool, str]:
    from sglang_dspark_dp.harness import startup

    results = startup.run_matrix(
        fix=False, topologies=((args.dp, 1), (args.dp, args.dp)), timeout_s=args.timeout
    )
    bad = [r for r in results if not r.correct]
    if bad:
        return False, "; ".join(f"{r.config.describe()}: {r.divergence}" for r in bad)
    return True, "every rank decided draft capture alike (plain TP, DP attention)"


def _judge_non_overlap_entry(args: argparse.Namespace) -> tuple[bool, str]:
    from sglang_dspark_dp.srt.managers import scheduler as entry

    result = entry.probe()
    if result.reaches:
        return True, "with --disable-overlap-schedule the steps reach the worker"
    return (
        False,
        f"with --disable-overlap-schedule every step crashes: {result.describe()}",
    )


def _judge_verify_budget(args: argparse.Namespace) -> tuple[bool, str]:
    status, lines = _compact_verify_phase(args)
    text = "; ".join(x.removeprefix("compact-verify: ") for x in lines)
    return status == EXIT_OK, text


def cmd_judge(args: argparse.Namespace) -> int:
    _quiet_sglang()
    from sglang_dspark_dp import adapter, registry
    from sglang_dspark_dp.harness.lockstep import CannotRun
    from sglang_dspark_dp.outcome import DidNotEnable
    from sglang_dspark_dp.package import installed_sglang_version

    fixes = [f.strip() for f in args.fixes.split(",") if f.strip()]
    unknown = [f for f in fixes if f not in JUDGED]
    if unknown or not fixes:
        _err(
            f"--fixes must name one or more of {', '.join(JUDGED)}, got "
            f"{args.fixes!r}"
        )
        return EXIT_CANNOT
    try:
        adapter.load_sglang_api()
    except DidNotEnable as exc:
        _err(f"cannot run: {exc}")
        return EXIT_CANNOT
    registry.uninstrument()  # the build alone, whatever was loaded
    args.no_fix = True  # every phase judges stock SGLang
    print(
        f"judge: sglang {installed_sglang_version()}, plugin off: judging this "
        f"build by behaviour ({', '.join(fixes)})",
        flush=True,
    )
    judges = {
        "draft-batch": _judge_draft_batch,
        "startup-capture": _judge_startup_capture,
        "non-overlap-entry": _judge_non_overlap_entry,
        "verify-budget": _judge_verify_budget,
    }
    missing = []
    for fix in fixes:
        try:
            ok, why = judges[fix](args)
        except (CannotRun, DidNotEnable) as exc:
            _err(f"cannot run: {fix}: {exc}")
            return EXIT_CANNOT
        if ok:
            print(f"judge: {fix}: fixed in this build: {why}", flush=True)
        else:
            missing.append(fix)
            print(f"judge: {fix}: NOT fixed in this build: {why}", flush=True)
    if missing:
        print(
            f"judge: FAILED: {len(missing)} of {len(fixes)} fixes missing "
            f"({', '.join(missing)}); the sglang-dspark-dp plugin repairs them"
        )
        return EXIT_FAIL
    print("judge: OK: this build carries every fix judged")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="sglang-dspark-dp", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", parser_class=_Parser)
    v = sub.add_parser("verify", help="simulate DP ranks and check lockstep (main job)")
    v.add_argument(
        "--dp",
        type=_int_arg("--dp", 2, 16),
        default=4,
        help="simulated DP ranks, 2-16 (default 4)",
    )
    v.add_argument(
        "--ep",
        action="store_true",
        help="EP on only (EP size = --dp); default: EP off, then on",
    )
    v.add_argument(
        "--steps",
        type=_int_arg("--steps", 1),
        default=2000,
        help="decode steps per EP tier (default 2000)",
    )
    v.add_argument("--seed", type=_int_arg("--seed"), default=0)
    v.add_argument(
        "--no-fix",
        action="store_true",
        help="run stock SGLang (shows the upstream crash on affected releases)",
    )
    v.add_argument(
        "--port",
        type=_int_arg("--port", 0, 65535),
        default=0,
        help="loopback port for the gloo group (default: a free one)",
    )
    v.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds any collective may wait (default 60)",
    )
    v.add_argument("--no-progress", action="store_true")
    v.add_argument(
        "--no-startup",
        action="store_true",
        help="skip the startup phase (the draft CUDA-graph capture decision)",
    )
    v.set_defaults(func=cmd_verify)
    d = sub.add_parser("doctor", help="report on the installed SGLang and the plugin")
    d.add_argument("--json", action="store_true")
    d.set_defaults(func=cmd_doctor)
    r = sub.add_parser("repro", help="one DP step: stock vs repaired")
    r.add_argument("--dp", type=_int_arg("--dp", 2, 16), default=2)
    r.set_defaults(func=cmd_repro)
    j = sub.add_parser(
        "judge", help="judge this SGLang build alone (plugin off) by behaviour"
    )
    j.add_argument(
        "--fixes",
        default=",".join(JUDGED),
        help=f"comma-separated fixes to look for (default: {','.join(JUDGED)})",
    )
    j.add_argument("--dp", type=_int_arg("--dp", 2, 16), default=2)
    j.add_argument(
        "--steps",
        type=_int_arg("--steps", 1),
        default=200,
        help="decode steps per EP tier (default 200)",
    )
    j.add_argument("--seed", type=_int_arg("--seed"), default=0)
    j.add_argument("--timeout", type=float, default=60.0)
    j.set_defaults(func=cmd_judge)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.cmd is None:
        parser.print_help()
        return EXIT_CANNOT
    from sglang_dspark_dp.package import missing_runtime

    missing = missing_runtime()  # the wrong venv: say so, no traceback
    if missing is not None:
        if getattr(args, "json", False):
            print(json.dumps({"dspark_present": False, "reason": missing}))
        _err(f"cannot run {args.cmd}: {missing}")
        return EXIT_CANNOT
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
