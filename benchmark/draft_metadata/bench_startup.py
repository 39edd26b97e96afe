"""Start-up cost of the plugin in a scheduler process.

SGLang calls ``sglang.srt.plugins.load_plugins()`` at the top of
``run_scheduler_process`` (``sglang/srt/managers/scheduler.py``), so every
scheduler process (one per TP/DP rank) pays for loading this plugin once:
importing it, running every repair's probe (``plugin.register()``, which
instruments each repair with ``apply=False``), and applying the hooks it
registered (``HookRegistry.apply_hooks()``, which ``load_plugins()`` runs
next). This script measures those three (wall time, and the process's CPU time,
which a busy machine inflates less), in a fresh interpreter per
sample that has already imported the SGLang modules the repairs patch and
probe (so their own import, which SGLang pays with or without the plugin,
is not counted), and reports the median of ``--runs`` interpreters per
Python given.

``--preload patched`` (default) imports, before the clock starts, the
DSpark draft, worker and planner modules the repairs patch and the SGLang
modules the probes read (the verify planner's helpers, the overlap
utilities, forward batch, schedule batch, spec info, the runtime context,
the plugin hook registry, the decode CUDA-graph runner, server args, the
DP-attention scheduler component, the TP worker, SGLang's utils); each
missing one is skipped and listed. ``--preload scheduler``
also imports ``sglang.srt.managers.scheduler`` first, which is what a
scheduler process has imported when ``load_plugins()`` runs (slower to
measure). Modules first imported during the timed part are counted in the
JSON, so an import the preload missed shows.

Usage::

    python benchmark/draft_metadata/bench_startup.py --runs 5 --out startup.json \\
        0.5.16=/venvs/0.5.16/bin/python 0.5.17=/venvs/0.5.17/bin/python

Each positional argument is ``LABEL=PYTHON`` or a bare ``PYTHON`` (the
label is then its SGLang version); none: this Python. The table's last
line evaluates the target: at most 200 ms added per scheduler process.

``load_plugins()`` only arms the repairs; each probes and applies when
DSpark's module it patches is first imported. With ``--preload patched``
those modules are imported already, so the probes run inside ``register``
as before. ``--preload none`` imports nothing of DSpark's first (only SGLang's
plugin loader, as the process that calls ``load_plugins()`` has) and adds a
phase,
``dspark``: importing DSpark's worker module, as the scheduler does when it
builds its speculative worker (SGLang's own import plus the probes it
arms); each run then also runs a child without the plugin, and the table
gives both and the difference.

``--process main`` measures the HTTP process instead: a child imports
``sglang.srt.server_args`` (as ``sglang serve`` has when it calls
``load_plugins()``), then times SGLang's ``load_plugins()`` with the plugin
(``SGLANG_PLUGINS=dspark_dp``) and without (a whitelist naming no
installed plugin), alternating, with the modules each adds. Target: at most
20 ms and no SGLang module added.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

try:  # installed: sglang-dspark-dp-bench
    from sglang_dspark_dp_bench.draft_metadata import bench_common as common
except ImportError:  # run as a script beside bench_common.py (the GPU machine)
    import bench_common as common

TARGET_MS = 200.0
#: The HTTP process's target: ``load_plugins()`` with the plugin against
#: without, and no SGLang module added.
MAIN_TARGET_MS = 20.0
PHASES = ("import", "register", "apply_hooks")
#: ``--preload none``'s extra phase: DSpark's worker module imported.
DSPARK_PHASE = "dspark"
DSPARK_WORKER = "sglang.srt.speculative.dspark_components.dspark_worker_v2"
#: ``SGLANG_PLUGINS`` for a child with the plugin and for one without.
WHITELIST = {True: "dspark_dp", False: "no_such_plugin"}

#: What the repairs patch and the probes read, imported before the clock.
PATCHED = (
    "sglang.srt.speculative.dspark_components.dspark_draft",
    "sglang.srt.speculative.dspark_components.dspark_worker_v2",
    "sglang.srt.speculative.dspark_components.dspark_planner",
    "sglang.srt.speculative.dspark_components.dspark_sps",
    "sglang.srt.speculative.ragged_verify",
    "sglang.kernels.ops.speculative.ragged_verify_kernels",
    "sglang.srt.managers.overlap_utils",
    "sglang.srt.model_executor.forward_batch_info",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.speculative.spec_info",
    "sglang.srt.runtime_context",
    "sglang.srt.speculative.draft_worker_common",
    "sglang.srt.plugins",
    "sglang.srt.plugins.hook_registry",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.server_args",
    "sglang.srt.arg_groups.cuda_graph_hook",
    "sglang.srt.managers.scheduler_components.dp_attn",
    "sglang.srt.managers.tp_worker",
    "sglang.srt.utils",
    "sglang.srt.utils.common",
)
PRELOADS = {
    "patched": PATCHED,
    "scheduler": ("sglang.srt.managers.scheduler", *PATCHED),
    # Nothing of DSpark's: only SGLang's plugin loader, which a process that
    # calls load_plugins() has imported (else its import, SGLang's own, would
    # be counted as the hooks' application).
    "none": ("sglang.srt.plugins", "sglang.srt.plugins.hook_registry"),
}


# --------------------------------------------------------------------------
# Child: one fresh interpreter, one sample.
# --------------------------------------------------------------------------


def _new_modules(before: set[str]) -> dict[str, Any]:
    new = sorted(set(sys.modules) - before)
    sglang_new = [m for m in new if m == "sglang" or m.startswith("sglang.")]
    ours = [m for m in new if m.startswith("sglang_dspark_dp")]
    others = sorted({m.split(".")[0] for m in new} - {"sglang", "sglang_dspark_dp"})
    return {
        "total": len(new),
        "sglang": sglang_new,
        "sglang_dspark_dp": len(ours),
        "other_top_level": others,
    }


def child_main(plugin: bool) -> dict[str, Any]:
    """The HTTP process: ``load_plugins()`` after ``server_args``, with the
    plugin whitelisted or not (``SGLANG_PLUGINS`` is set by the parent)."""
    importlib.import_module("sglang.srt.server_args")
    loader = importlib.import_module("sglang.srt.plugins")
    before = set(sys.modules)
    w0, c0 = time.perf_counter(), time.process_time()
    loader.load_plugins()
    w1, c1 = time.perf_counter(), time.process_time()
    return {
        "process": "main",
        "plugin": plugin,
        "ms": {"load_plugins": (w1 - w0) * 1e3},
        "cpu_ms": {"load_plugins": (c1 - c0) * 1e3},
        "new_modules": _new_modules(before),
        "sglang": _sglang_version(),
    }


def _sglang_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def child(preload: str, plugin: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {"preload": preload, "plugin": plugin}
    t0 = time.perf_counter()
    loaded, missing = [], []
    for name in PRELOADS[preload]:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as exc:
            missing.append(f"{name}: {type(exc).__name__}")
    out["preload_s"] = time.perf_counter() - t0
    out["preloaded"], out["preload_missing"] = loaded, missing
    before = set(sys.modules)

    wall, cpu = time.perf_counter, time.process_time
    marks = [(wall(), cpu())]
    names = list(PHASES)
    if plugin:
        loaded = importlib.import_module("sglang_dspark_dp.plugin")
        marks.append((wall(), cpu()))
        loaded.register()
        marks.append((wall(), cpu()))
        from sglang_dspark_dp import adapter

        adapter.apply_hooks()
    else:
        marks += [marks[0], marks[0]]
    marks.append((wall(), cpu()))
    if preload == "none":
        importlib.import_module(DSPARK_WORKER)
        marks.append((wall(), cpu()))
        names.append(DSPARK_PHASE)
    for key, k in (("ms", 0), ("cpu_ms", 1)):
        phases = {
            name: (marks[i + 1][k] - marks[i][k]) * 1e3 for i, name in enumerate(names)
        }
        phases["total"] = (marks[-1][k] - marks[0][k]) * 1e3
        out[key] = phases
    out["new_modules"] = _new_modules(before)
    if plugin:
        from sglang_dspark_dp import registry

        out["repairs"] = {st.repair: st.outcome.value for st in registry.status()}
    out["sglang"] = _sglang_version()
    out["python"] = sys.version.split()[0]
    try:
        import torch

        out["torch"] = torch.__version__
    except Exception:
        out["torch"] = None
    return out


# --------------------------------------------------------------------------
# Parent: several Pythons, several interpreters each.
# --------------------------------------------------------------------------


def parse_targets(values: list[str]) -> list[tuple[str | None, str]]:
    """``LABEL=PYTHON`` or ``PYTHON`` -> ``(label or None, python)``."""
    out = []
    for v in values:
        label, sep, path = v.partition("=")
        if sep and (not label or not path):
            raise ValueError(f"expected LABEL=PYTHON or PYTHON, got {v!r}")
        out.append((label, path) if sep else (None, v))
    return out


#: What a child's environment goes without: the plugin as SGLang would
#: load it, and the plugin's own switches.
CHILD_ENV_DROP = (
    "SGLANG_PLUGINS",
    "SGLANG_DSPARK_DP_DISABLE",
    "SGLANG_DSPARK_DP_GUARD",
)


def run_one(
    python: str,
    preload: str,
    timeout: float,
    *,
    process: str = "scheduler",
    plugin: bool = True,
) -> dict[str, Any]:
    env = common.child_env(drop=CHILD_ENV_DROP)
    argv = ["--child", "--preload", preload, "--process", process]
    if process == "main" or not plugin:
        # The plugin in or out as SGLang's own whitelist decides.
        env["SGLANG_PLUGINS"] = WHITELIST[plugin]
    if not plugin:
        argv.append("--no-plugin")
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-10:]
        return {"error": f"child exited {proc.returncode}", "log_tail": tail}
    return json.loads(lines[-1])


def summarize(
    label: str | None, python: str, samples: list[dict[str, Any]]
) -> dict[str, Any]:
    good = [s for s in samples if "error" not in s]
    out: dict[str, Any] = {"python": python, "samples": samples}
    if not good:
        out["label"] = label or python
        out["error"] = samples[-1].get("error") if samples else "no sample"
        return out
    first = good[0]
    out["label"] = label or str(first.get("sglang"))
    for key in (
        "sglang",
        "torch",
        "repairs",
        "preload",
        "preload_missing",
        "process",
    ):
        out[key] = first.get(key)
    out["plugin"] = first.get("plugin", True)
    phases = list(first["ms"])
    out["median_ms"] = {k: statistics.median(s["ms"][k] for s in good) for k in phases}
    out["median_cpu_ms"] = {
        k: statistics.median(s["cpu_ms"][k] for s in good) for k in phases
    }
    key = "load_plugins" if "load_plugins" in first["ms"] else "total"
    totals = [s["ms"][key] for s in good]
    out["total_ms_range"] = [min(totals), max(totals)]
    out["runs"] = len(good)
    out["new_modules_median"] = statistics.median(
        s["new_modules"]["total"] for s in good
    )
    out["new_sglang_modules"] = sorted(
        {m for s in good for m in s["new_modules"]["sglang"]}
    )
    out["new_other_top_level"] = sorted(
        {m for s in good for m in s["new_modules"]["other_top_level"]}
    )
    out["target_met"] = out["median_ms"]["total" if key == "total" else key] <= (
        TARGET_MS if key == "total" else MAIN_TARGET_MS
    )
    return out


def _repairs(r: dict[str, Any]) -> str:
    if r.get("plugin") is False:
        return "(no plugin)"
    return ", ".join(f"{k}: {v}" for k, v in (r.get("repairs") or {}).items())


def render_table(releases: list[dict[str, Any]]) -> str:
    """The scheduler process's table (one row per release and variant)."""
    dspark = any(DSPARK_PHASE in r.get("median_ms", {}) for r in releases)
    head = [
        "sglang",
        "import ms",
        "probes ms (register)",
        "apply hooks ms",
        *(["DSpark import ms"] if dspark else []),
        "total ms (median)",
        "total min-max",
        "total CPU ms (median)",
        "runs",
        "SGLang modules first imported",
        "repairs",
    ]
    rows = []
    for r in releases:
        if "error" in r:
            rows.append([r["label"], *["-"] * (len(head) - 4), "0", "-", r["error"]])
            continue
        m = r["median_ms"]
        lo, hi = r["total_ms_range"]
        rows.append(
            [
                r["label"],
                f"{m['import']:.1f}",
                f"{m['register']:.1f}",
                f"{m['apply_hooks']:.2f}",
                *([f"{m.get(DSPARK_PHASE, 0.0):.1f}"] if dspark else []),
                f"{m['total']:.1f}",
                f"{lo:.1f}-{hi:.1f}",
                f"{r['median_cpu_ms']['total']:.1f}",
                str(r["runs"]),
                str(len(r["new_sglang_modules"])),
                _repairs(r),
            ]
        )
    return "\n".join(common.table_lines(head, rows))


def _pairs(releases: list[dict[str, Any]]):
    """``(with plugin, without)`` summaries of one label, where both ran."""
    by = {}
    for r in releases:
        if "error" not in r:
            by.setdefault(r["label"], {})[bool(r.get("plugin", True))] = r
    return [(v[True], v[False]) for v in by.values() if True in v and False in v]


def render_target(releases: list[dict[str, Any]]) -> str:
    judged = [r for r in releases if "error" not in r and r.get("plugin", True)]
    if not judged:
        return f"target (<= {TARGET_MS:g} ms per scheduler process): n/a"
    pairs = _pairs(releases)
    if pairs:  # --preload none: the plugin's share is the difference
        added = [
            on["median_ms"]["total"] - off["median_ms"]["total"] for on, off in pairs
        ]
        worst = max(added)
        verdict = "met" if worst <= TARGET_MS else "NOT met"
        return (
            f"target (<= {TARGET_MS:g} ms added per scheduler process, median with "
            f"the plugin minus without): {verdict} (largest {worst:.1f} ms)"
        )
    worst = max(r["median_ms"]["total"] for r in judged)
    verdict = "met" if all(r["target_met"] for r in judged) else "NOT met"
    return (
        f"target (<= {TARGET_MS:g} ms added per scheduler process, median): "
        f"{verdict} (largest median {worst:.1f} ms)"
    )


def render_main(releases: list[dict[str, Any]]) -> str:
    """The HTTP process's table and its target line."""
    head = [
        "sglang",
        "plugin",
        "load_plugins() ms (median)",
        "min-max",
        "CPU ms (median)",
        "modules added (median)",
        "SGLang modules added",
        "runs",
    ]
    rows = []
    for r in releases:
        if "error" in r:
            rows.append([r["label"], "-", "-", "-", "-", "-", "-", r["error"]])
            continue
        lo, hi = r["total_ms_range"]
        rows.append(
            [
                r["label"],
                "on" if r.get("plugin") else "off",
                f"{r['median_ms']['load_plugins']:.1f}",
                f"{lo:.1f}-{hi:.1f}",
                f"{r['median_cpu_ms']['load_plugins']:.1f}",
                f"{r['new_modules_median']:g}",
                str(len(r["new_sglang_modules"])),
                str(r["runs"]),
            ]
        )
    lines = common.table_lines(head, rows)
    pairs = _pairs(releases)
    if not pairs:
        lines.append(f"target (<= {MAIN_TARGET_MS:g} ms, no SGLang module): n/a")
        return "\n".join(lines)
    added = [
        on["median_ms"]["load_plugins"] - off["median_ms"]["load_plugins"]
        for on, off in pairs
    ]
    sglang_added = max(len(on["new_sglang_modules"]) for on, _ in pairs)
    met = max(added) <= MAIN_TARGET_MS and sglang_added == 0
    lines.append(
        f"target (<= {MAIN_TARGET_MS:g} ms added to the HTTP process's "
        f"load_plugins(), median with the plugin minus without, and no SGLang "
        f"module added): {'met' if met else 'NOT met'} (largest "
        f"{max(added):.1f} ms, {sglang_added} SGLang modules)"
    )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Time the plugin's import, probes and hook application in "
        "fresh interpreters: a scheduler process (the SGLang modules it patches "
        "imported first, or nothing with --preload none) or the HTTP process "
        "(--process main)."
    )
    p.add_argument("pythons", nargs="*", metavar="[LABEL=]PYTHON")
    p.add_argument("--runs", type=int, default=5, help="interpreters per Python")
    p.add_argument("--preload", choices=sorted(PRELOADS), default="patched")
    p.add_argument("--process", choices=("scheduler", "main"), default="scheduler")
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--child-timeout", type=float, default=600)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-plugin", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        if args.process == "main":
            sample = child_main(not args.no_plugin)
        else:
            sample = child(args.preload, plugin=not args.no_plugin)
        print(json.dumps(sample, default=str))
        return 0
    if args.runs < 1:
        raise SystemExit(f"--runs must be at least 1 (got {args.runs})")
    try:
        targets = parse_targets(args.pythons) or [(None, sys.executable)]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    # Both variants, alternating run by run, where the plugin's share is a
    # difference; the scheduler with the DSpark modules preloaded as before.
    both = args.process == "main" or args.preload == "none"
    variants = (True, False) if both else (True,)
    releases = []
    for label, python in targets:
        samples: dict[bool, list[dict[str, Any]]] = {v: [] for v in variants}
        load_before = os.getloadavg()[0]
        for k in range(args.runs):
            for plugin in variants:
                s = run_one(
                    python,
                    args.preload,
                    args.child_timeout,
                    process=args.process,
                    plugin=plugin,
                )
                samples[plugin].append(s)
                key = "load_plugins" if args.process == "main" else "total"
                shown = "error" if "error" in s else f"{s['ms'][key]:.1f} ms"
                tag = "" if not both else (" plugin" if plugin else " no plugin")
                print(f"[{label or python}{tag}] run {k + 1}: {shown}", file=sys.stderr)
        for plugin in variants:
            releases.append(summarize(label, python, samples[plugin]))
            releases[-1]["plugin"] = plugin
            releases[-1]["load_average_1min"] = [load_before, os.getloadavg()[0]]
    combined = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "process": args.process,
        "preload": args.preload,
        "runs": args.runs,
        "target_ms": MAIN_TARGET_MS if args.process == "main" else TARGET_MS,
        "releases": releases,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(combined, indent=1, default=str) + "\n")
    if args.process == "main":
        print(render_main(releases))
    else:
        print(render_table(releases))
        print(render_target(releases))
    return 0 if all("error" not in r for r in releases) else 1


if __name__ == "__main__":
    sys.exit(main())
