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
PHASES = ("import", "register", "apply_hooks")

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
}


# --------------------------------------------------------------------------
# Child: one fresh interpreter, one sample.
# --------------------------------------------------------------------------


def child(preload: str) -> dict[str, Any]:
    out: dict[str, Any] = {"preload": preload}
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
    plugin = importlib.import_module("sglang_dspark_dp.plugin")
    marks.append((wall(), cpu()))
    plugin.register()
    marks.append((wall(), cpu()))
    from sglang_dspark_dp import adapter

    adapter.apply_hooks()
    marks.append((wall(), cpu()))
    for key, k in (("ms", 0), ("cpu_ms", 1)):
        phases = {
            name: (marks[i + 1][k] - marks[i][k]) * 1e3 for i, name in enumerate(PHASES)
        }
        phases["total"] = (marks[-1][k] - marks[0][k]) * 1e3
        out[key] = phases
    new = sorted(set(sys.modules) - before)
    sglang_new = [m for m in new if m == "sglang" or m.startswith("sglang.")]
    ours = [m for m in new if m.startswith("sglang_dspark_dp")]
    others = sorted({m.split(".")[0] for m in new} - {"sglang", "sglang_dspark_dp"})
    out["new_modules"] = {
        "total": len(new),
        "sglang": sglang_new,
        "sglang_dspark_dp": len(ours),
        "other_top_level": others,
    }
    from sglang_dspark_dp import registry
    from sglang_dspark_dp.package import installed_sglang_version

    out["repairs"] = {st.repair: st.outcome.value for st in registry.status()}
    out["sglang"] = installed_sglang_version()
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


def run_one(python: str, preload: str, timeout: float) -> dict[str, Any]:
    proc = subprocess.run(
        [python, str(Path(__file__).resolve()), "--child", "--preload", preload],
        capture_output=True,
        text=True,
        env=common.child_env(drop=CHILD_ENV_DROP),
        timeout=timeout,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-10:]
        return {"error": f"child exited {proc.returncode}", "log_tail": tail}
    return json.loads(lines[-1])


def summarize(label: str | None, python: str, samples: list[dict[str, Any]]):
    good = [s for s in samples if "error" not in s]
    out: dict[str, Any] = {"python": python, "samples": samples}
    if not good:
        out["label"] = label or python
        out["error"] = samples[-1].get("error") if samples else "no sample"
        return out
    first = good[0]
    out["label"] = label or str(first.get("sglang"))
    for key in ("sglang", "torch", "repairs", "preload", "preload_missing"):
        out[key] = first.get(key)
    out["median_ms"] = {
        k: statistics.median(s["ms"][k] for s in good) for k in (*PHASES, "total")
    }
    out["median_cpu_ms"] = {
        k: statistics.median(s["cpu_ms"][k] for s in good) for k in (*PHASES, "total")
    }
    totals = [s["ms"]["total"] for s in good]
    out["total_ms_range"] = [min(totals), max(totals)]
    out["runs"] = len(good)
    out["new_sglang_modules"] = sorted(
        {m for s in good for m in s["new_modules"]["sglang"]}
    )
    out["new_other_top_level"] = sorted(
        {m for s in good for m in s["new_modules"]["other_top_level"]}
    )
    out["target_met"] = out["median_ms"]["total"] <= TARGET_MS
    return out


def render_table(releases: list[dict[str, Any]]) -> str:
    head = [
        "sglang",
        "import ms",
        "probes ms (register)",
        "apply hooks ms",
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
            rows.append(
                [r["label"], "-", "-", "-", "-", "-", "-", "0", "-", r["error"]]
            )
            continue
        m = r["median_ms"]
        lo, hi = r["total_ms_range"]
        repairs = ", ".join(f"{k}: {v}" for k, v in (r.get("repairs") or {}).items())
        rows.append(
            [
                r["label"],
                f"{m['import']:.1f}",
                f"{m['register']:.1f}",
                f"{m['apply_hooks']:.2f}",
                f"{m['total']:.1f}",
                f"{lo:.1f}-{hi:.1f}",
                f"{r['median_cpu_ms']['total']:.1f}",
                str(r["runs"]),
                str(len(r["new_sglang_modules"])),
                repairs,
            ]
        )
    return "\n".join(common.table_lines(head, rows))


def render_target(releases: list[dict[str, Any]]) -> str:
    judged = [r for r in releases if "error" not in r]
    if not judged:
        return f"target (<= {TARGET_MS:g} ms per scheduler process): n/a"
    worst = max(r["median_ms"]["total"] for r in judged)
    verdict = "met" if all(r["target_met"] for r in judged) else "NOT met"
    return (
        f"target (<= {TARGET_MS:g} ms added per scheduler process, median): "
        f"{verdict} (largest median {worst:.1f} ms)"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Time the plugin's import, probes and hook application in "
        "fresh interpreters that already imported the SGLang modules it patches."
    )
    p.add_argument("pythons", nargs="*", metavar="[LABEL=]PYTHON")
    p.add_argument("--runs", type=int, default=5, help="interpreters per Python")
    p.add_argument("--preload", choices=sorted(PRELOADS), default="patched")
    p.add_argument("--out", default=None, help="write the JSON here")
    p.add_argument("--child-timeout", type=float, default=600)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        print(json.dumps(child(args.preload), default=str))
        return 0
    try:
        targets = parse_targets(args.pythons) or [(None, sys.executable)]
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    releases = []
    for label, python in targets:
        samples = []
        load_before = os.getloadavg()[0]
        for k in range(args.runs):
            samples.append(run_one(python, args.preload, args.child_timeout))
            s = samples[-1]
            shown = "error" if "error" in s else f"{s['ms']['total']:.1f} ms"
            print(f"[{label or python}] run {k + 1}: {shown}", file=sys.stderr)
        releases.append(summarize(label, python, samples))
        releases[-1]["load_average_1min"] = [load_before, os.getloadavg()[0]]
    combined = {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.machine(),
            "cpus": os.cpu_count(),
        },
        "preload": args.preload,
        "runs": args.runs,
        "target_ms": TARGET_MS,
        "releases": releases,
    }
    if args.out:
        Path(args.out).write_text(json.dumps(combined, indent=1, default=str) + "\n")
    print(render_table(releases))
    print(render_target(releases))
    return 0 if all("error" not in r for r in releases) else 1


if __name__ == "__main__":
    sys.exit(main())
