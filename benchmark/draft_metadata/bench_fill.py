"""Per-step cost of DSpark's draft DP/EP metadata fill, stock vs plugin.

Drives the installed SGLang's real ``DraftBlockProposer`` and measures, for
``_fill_dp_moe_sync_metadata`` as the installed SGLang runs it (stock, or
with this plugin's hook applied), in two call patterns: ``steady`` (the
same counts every call, as in decoding with no arrival or finish on any
rank) and ``churn`` (this rank's token count and the per-rank counts change
at every call):

* host microseconds of one fill call (median, p90);
* host milliseconds of one fill call enqueued behind ~100 ms of GPU work
  (``torch.cuda._sleep``): a fill that waits for the stream shows ~100 ms;
* device allocations per fill (``allocation.all.allocated`` delta / calls);
* on CUDA, whether the plugin's host buffers are page-locked (each one's
  ``is_pinned()``; from pageable memory the copy makes the host wait);
* whether the DP/EP fields come out right, on the fill alone and through a
  busy and an idle rank of a DP-4 decode step with a real
  ``DecodeCudaGraphRunner.can_run_graph`` deciding admission.

``compare`` runs one child per (SGLang, mode) and prints one table. See
README.md in this folder.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

try:  # installed: sglang-dspark-dp-bench
    from sglang_dspark_dp_bench.draft_metadata import bench_common as common
except ImportError:  # run as a script beside bench_common.py (the GPU machine)
    import bench_common as common

MODES = ("stock", "plugin", "auto")
SLEEP_MS = 100.0


# --------------------------------------------------------------------------
# Worker: one SGLang, one mode, in this process.
# --------------------------------------------------------------------------


def _apply_mode(mode: str) -> dict[str, Any]:
    """Put the fill in the requested state; say what fill now runs."""
    from sglang_dspark_dp.outcome import Outcome
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    info: dict[str, Any] = {"mode": mode}
    if mode == "stock":
        REPAIR.uninstrument()  # no-op unless something instrumented
    elif mode == "plugin":
        REPAIR.instrument(apply=True)
    elif mode == "auto":
        # What ``sglang serve`` does: load every installed plugin through
        # its entry point (ours only if this repo is pip-installed).
        from sglang.srt.plugins import load_plugins

        load_plugins()
    st = REPAIR.status()
    info["status"] = st.as_dict()
    if st.outcome is Outcome.NOT_APPLICABLE:
        info["did_not_enable"] = st.reason
    plan = REPAIR.plan if REPAIR.instrumented else None
    if plan is None:
        info["fill"] = "stock"
        if mode != "stock":
            info["fill"] = f"stock (plugin {st.outcome.value})"
    elif plan.dp_groups and not plan.dp_calls_stock:
        info["fill"] = "plugin"
    elif plan.dp_groups:
        info["fill"] = "stock+plugin"
    else:
        # Hook registered for another path; the DP path passes through.
        info["fill"] = "stock (hook pass-through)"
    info["plan"] = plan.describe() if plan is not None else st.reason
    return info


def _calibrate_sleep(torch: Any) -> float:
    """GPU cycles of ``torch.cuda._sleep`` per millisecond on this device."""
    cycles = 10_000_000
    torch.cuda._sleep(cycles)  # warm-up (module load)
    torch.cuda.synchronize()
    return common.sleep_cycles_per_ms(torch, cycles)


def _host_ms_behind_busy_gpu(torch: Any, fn: Any, cycles: int, reps: int = 3):
    """Median host time of ``fn()`` enqueued behind ``cycles`` of GPU sleep."""
    out = []
    for _ in range(reps):
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)
        t0 = time.perf_counter_ns()
        fn()
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        out.append((t1 - t0) / 1e6)
    return statistics.median(out), out


#: Call patterns measured per (release, mode): ``steady`` fills with the
#: same counts every call, ``churn`` with counts that change every call.
PATTERNS = ("steady", "churn")


def rank_counts(bs: int, dp: int) -> list[int]:
    """Per-rank request counts: rank 0 busy (``bs``), rank 1 idle, the
    others alternately ``bs // 2`` and idle."""
    return [bs] + [(bs // 2 if r % 2 == 0 else 0) for r in range(1, dp)]


def churn_counts(bs: int, counts: list[int]) -> tuple[int, list[int]]:
    """The second batch of the churn pattern: this rank's batch size and
    another rank's count both differ from ``counts``, so every fill of the
    alternation sees a new token count and new per-rank vectors."""
    bs_b = bs - 1 if bs > 1 else bs + 1
    other = list(counts)
    other[0] = bs_b
    if len(other) > 1:
        other[1] += 1
    return bs_b, other


def _measure(
    torch: Any, calls: list[Any], args: argparse.Namespace, device: str, cycles: int
) -> dict[str, Any]:
    """Host time, host time behind a busy GPU and device allocations of
    ``calls`` taken in turn (one call: the same inputs every time)."""
    k = len(calls)
    warm = min(100, max(10, args.iters // 10))
    for i in range(warm):
        calls[i % k]()
    if device == "cuda":
        torch.cuda.synchronize()
    samples = []
    clock = time.perf_counter_ns
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(args.iters):
            fn = calls[i % k]
            t0 = clock()
            fn()
            samples.append((clock() - t0) / 1e3)
    finally:
        if gc_was:
            gc.enable()
    out: dict[str, Any] = {
        "host_us": {
            "median": statistics.median(samples),
            "p90": common.percentile(samples, 0.9),
            "mean": statistics.fmean(samples),
            "min": min(samples),
            "iters": len(samples),
        },
        "busy": None,
        "device_allocs_per_step": None,
    }
    if device != "cuda":
        return out
    turn = iter(range(1 << 62))

    def next_call():
        calls[next(turn) % k]()

    ms, reps = _host_ms_behind_busy_gpu(torch, next_call, cycles)
    out["busy"] = {
        "host_ms": ms,
        "reps_ms": reps,
        "gpu_sleep_ms": SLEEP_MS,
        "cycles": cycles,
    }
    torch.cuda.synchronize()
    n_calls = min(args.iters, 1000)
    key = "allocation.all.allocated"
    before = torch.cuda.memory_stats().get(key, 0)
    for i in range(n_calls):
        calls[i % k]()
    after = torch.cuda.memory_stats().get(key, 0)
    torch.cuda.synchronize()
    out["device_allocs_per_step"] = (after - before) / n_calls
    return out


#: The fields the fill's own check always reports.
FILL_FIELDS = ("unscaled", "non_padded", "non_padded_cpu")


def _gaps(fields: dict[str, Any], *, counts, tokens, width, device_count, device):
    from sglang_dspark_dp import expectations

    return expectations.check(
        fields,
        expectations.expect(
            tokens=tokens,
            counts=list(counts),
            width=width,
            device_count=device_count,
            device=device,
        ),
    )


def _fill_checks(fb: Any, names: Any, *, counts, tokens, width, device, device_count):
    """Each DP/EP field of one filled batch: ok, missing or wrong (why)."""
    from sglang_dspark_dp import expectations

    fields = expectations.observe(fb, names, read_device=True)
    checks = {key: "ok" for key in FILL_FIELDS}
    for gap in _gaps(
        fields,
        counts=counts,
        tokens=tokens,
        width=width,
        device_count=device_count,
        device=device,
    ):
        if checks.get(gap.key, "ok") != "ok":
            continue
        checks[gap.key] = (
            "missing" if gap.got is None else f"wrong ({gap.why}; got {gap.got!r})"
        )
    return checks


def _driver_checks(api: Any, names: Any, *, counts: list[int], gamma: int, device):
    """Busy rank 0 and idle rank 1 (``counts[1] == 0``) of one DP decode step
    through real proposers and a real ``can_run_graph`` (device tensors where
    ``device`` is cuda)."""
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import MAX_CAPTURE_BS
    from sglang_dspark_dp.drivers.draft import DraftDriver

    capture = adapter.capture_sizes(MAX_CAPTURE_BS)
    dp = len(counts)
    graph = adapter.graph_runner(api, dp_size=dp, width=gamma, capture_bs=capture)
    out: dict[str, Any] = {"counts": counts}
    for label, rank in (("busy_rank", 0), ("idle_rank", 1)):
        if rank >= dp:
            continue
        res: dict[str, Any] = {"rank": rank}
        try:
            with adapter.parallel_override(
                api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=dp
            ):
                driver = DraftDriver(
                    api,
                    gamma=gamma,
                    dp_moe_sync=True,
                    graph=graph,
                    names=names,
                    device=device,
                )
                seen = driver.step(counts[rank], list(counts))
                wants_device = api.enable_num_token_non_padded()
            problems = []
            if seen is None:
                problems.append("no draft forward on this rank")
            else:
                if seen.admitted is not (max(counts) <= max(capture)):
                    problems.append(f"admitted={seen.admitted}")
                problems += [
                    g.render(names)
                    for g in _gaps(
                        seen.fields,
                        counts=counts,
                        tokens=counts[rank] * driver.width,
                        width=driver.width,
                        device_count=wants_device,
                        device=device,
                    )
                ]
            res["ok"] = not problems
            res["problems"] = problems
        except Exception as exc:
            res["ok"] = False
            res["error"] = f"crash: {type(exc).__name__}: {exc}"
        out[label] = res
    out["ok"] = all(out[k]["ok"] for k in ("busy_rank", "idle_rank") if k in out)
    return out


def _explain(api: Any, torch: Any, device: str, *, bs: int, gamma: int, dp: int):
    """Time each candidate statement of the fills alone, behind a busy GPU."""
    from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
        DraftDPBuffers,
    )

    dev = torch.device(device)
    n = bs * gamma
    gnt = [bs * gamma] * dp
    spec = api.make_spec_info(draft_token_num=gamma, device=dev)
    bufs = DraftDPBuffers(dev)
    flip = [0]

    def plugin_update():
        # A changed step every call (two value sets alternating), as in churn.
        flip[0] ^= 1
        return bufs.update(n - flip[0], gnt, gnt)

    plugin_update()
    candidates = {
        # 0.5.17 stock: num_token_non_padded
        "torch.tensor(n, dtype=int32, device=dev)": lambda: torch.tensor(
            n, dtype=torch.int32, device=dev
        ),
        # 0.5.16/0.5.17 stock: global_num_tokens_gpu (and the logprob twin)
        "torch.tensor(gnt, dtype=int64).to(dev, non_blocking=True)": lambda: (
            torch.tensor(gnt, dtype=torch.int64).to(dev, non_blocking=True)
        ),
        "spec_scale_global_num_tokens(spec, gnt, gnt)": lambda: api.scale(
            spec, gnt, gnt
        ),
        "enable_num_token_non_padded()": api.enable_num_token_non_padded,
        # control: the same scalar, explicit blocking copy
        "torch.tensor(n, dtype=int32).to(dev)": lambda: torch.tensor(
            n, dtype=torch.int32
        ).to(dev),
        # plugin: scalar + both rows into the free packed pinned host buffer,
        # one async copy, an event recorded; no kernel
        "buffers.update(n, gnt, gnt) [packed, one copy_]": (plugin_update),
    }
    cycles = int(SLEEP_MS * _calibrate_sleep(torch)) if dev.type == "cuda" else 0
    rows = []
    for label, fn in candidates.items():
        for _ in range(20):
            fn()
        t = []
        for _ in range(200):
            t0 = time.perf_counter_ns()
            fn()
            t.append((time.perf_counter_ns() - t0) / 1e3)
        row: dict[str, Any] = {"statement": label, "idle_us": statistics.median(t)}
        if dev.type == "cuda":
            ms, _ = _host_ms_behind_busy_gpu(torch, fn, cycles)
            row["busy_host_ms"] = ms
            row["blocks"] = ms > SLEEP_MS / 2
        else:
            row["busy_host_ms"] = None
            row["blocks"] = None
        rows.append(row)
    return rows


def _host_buffers_pinned(proposer: Any, device: str) -> bool | None:
    """Whether the repaired fill's host buffers are page-locked, asked of
    each tensor itself (``is_pinned()``); None where there is nothing to pin
    (the CPU) or no buffer (stock's fill ran)."""
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        held_buffers,
    )

    held = held_buffers(proposer)
    if held is None or device != "cuda":
        return None
    hosts = held.host_tensors()
    return bool(hosts) and all(t.is_pinned() for t in hosts)


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.drivers import DRAFT_WIDTH, builders
    from sglang_dspark_dp.srt.model_executor.forward_batch_info import (
        DraftDPFieldNames,
    )
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    if args.gamma is None:
        args.gamma = DRAFT_WIDTH
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch.cuda.is_available() is False")
    api = adapter.load_sglang_api()
    result: dict[str, Any] = {
        "sglang": common.sglang_version(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "device": device,
        "device_name": (torch.cuda.get_device_name() if device == "cuda" else "cpu"),
        "params": {"iters": args.iters, "dp": args.dp, "bs": args.bs},
    }
    result.update(_apply_mode(args.mode))
    names = (
        REPAIR.probe_result.names
        if REPAIR.probe_result is not None
        else DraftDPFieldNames.for_forward_batch(api.forward_batch_cls)
    )
    fill = getattr(api.proposer_cls, adapter.FILL)
    counts = rank_counts(args.bs, args.dp)
    with adapter.parallel_override(
        api.get_parallel, dp_size=args.dp, dp_rank=0, ep_size=args.dp
    ):
        result["enable_num_token_non_padded"] = bool(api.enable_num_token_non_padded())
        proposer = builders.build_draft_proposer(
            api,
            draft_model_runner=builders.DeviceOnlyRunner(torch.device(device)),
            gamma=args.gamma,
            dp_moe_sync=True,
        )
        spec = adapter.draft_spec_info(proposer)
        width = adapter.draft_width(proposer)
        bs_b, counts_b = churn_counts(args.bs, counts)
        result["params"].update(
            gamma=args.gamma, width=width, counts=counts, churn_counts=counts_b
        )

        def new_batches(global_counts: list[int], bs: int):
            fb = builders.make_draft_forward_batch(
                api, bs=bs, width=width, spec_info=spec, device=device
            )
            batch = builders.make_schedule_batch(
                api,
                seq_lens=torch.full((bs,), 8, dtype=torch.int64, device=device),
                global_num_tokens=global_counts,
            )
            return fb, batch

        # Steady: the same counts every call (decoding with no arrival or
        # finish on any rank). Churn: this rank's token count and the per-rank
        # counts change at every call (two batch pairs, alternated).
        pairs = {"steady": [new_batches(list(counts), args.bs)]}
        pairs["churn"] = [pairs["steady"][0], new_batches(counts_b, bs_b)]
        cycles = int(SLEEP_MS * _calibrate_sleep(torch)) if device == "cuda" else 0
        patterns: dict[str, Any] = {}
        for pattern in PATTERNS:
            calls = [
                (lambda fb=fb, batch=batch: fill(proposer, fb, batch))
                for fb, batch in pairs[pattern]
            ]
            patterns[pattern] = _measure(torch, calls, args, device, cycles)
        result["patterns"] = patterns
        # Top-level figures as before this split: the same counts every call.
        for key in ("host_us", "busy", "device_allocs_per_step"):
            result[key] = patterns["steady"][key]

        # Correctness on fresh batches (read back after timing): the counts of
        # one pair, then the other, then the first again twice, so a value
        # left over from the previous step would show.
        checks: dict[str, str] = {}
        sequence = [(counts, args.bs), (counts_b, bs_b)] + [(counts, args.bs)] * 2
        for c, bs_c in sequence:
            fb, batch = new_batches(list(c), bs_c)
            fill(proposer, fb, batch)
            got = _fill_checks(
                fb,
                names,
                counts=c,
                tokens=bs_c * width,
                width=width,
                device=device,
                device_count=result["enable_num_token_non_padded"],
            )
            for key, verdict in got.items():
                if checks.get(key, "ok") == "ok":
                    checks[key] = verdict
        result["fill_fields"] = checks
        result["host_buffers_pinned"] = _host_buffers_pinned(proposer, device)
        if args.explain:
            result["explain"] = _explain(
                api, torch, device, bs=args.bs, gamma=args.gamma, dp=args.dp
            )
    result["driver"] = _driver_checks(
        api, names, counts=counts, gamma=args.gamma, device=device
    )
    result["dp_fields"] = dp_fields_cell(result)
    result["correct"] = result["dp_fields"] == "present"
    return result


def dp_fields_cell(r: dict[str, Any]) -> str:
    fields = r.get("fill_fields") or {}
    missing = [k for k, v in fields.items() if v == "missing"]
    wrong = [f"{k}: {v}" for k, v in fields.items() if v not in ("ok", "missing")]
    driver = r.get("driver") or {}
    errors = [
        driver[k].get("error") or "; ".join(driver[k].get("problems", []))
        for k in ("busy_rank", "idle_rank")
        if k in driver and not driver[k].get("ok")
    ]
    if not missing and not wrong and not errors:
        return "present"
    head = "missing" if missing else ("wrong" if wrong else "present")
    crash = next((e for e in errors if e.startswith("crash:")), None)
    if crash:
        return f"{head} → {crash}"
    detail = ", ".join(missing) or "; ".join(wrong + errors)
    return f"{head} ({detail})"


# --------------------------------------------------------------------------
# compare: one child per (SGLang, mode), one table.
# --------------------------------------------------------------------------


def run_compare(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for label, py, site in common.compare_targets(args):
        for mode in args.modes:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "r.json"
                cmd = [
                    py,
                    str(Path(__file__).resolve()),
                    "--device", args.device,
                    "--iters", str(args.iters),
                    "--dp", str(args.dp),
                    "--bs", str(args.bs),
                    "--mode", mode,
                    "--out", str(out),
                ]  # fmt: skip
                if args.gamma is not None:
                    cmd += ["--gamma", str(args.gamma)]
                if args.explain and mode == "stock":
                    cmd.append("--explain")
                t0 = time.monotonic()
                proc = subprocess.run(
                    cmd,
                    capture_output=True,
                    text=True,
                    env=common.child_env(site),
                    timeout=args.child_timeout,
                )
                if proc.returncode == 0 and out.exists():
                    r = json.loads(out.read_text())
                else:
                    tail = (proc.stdout + proc.stderr).strip().splitlines()[-15:]
                    r = {
                        "mode": mode,
                        "fill": mode,
                        "error": f"child exited {proc.returncode}",
                        "log_tail": tail,
                    }
                    print(f"[{label} {mode}] FAILED:\n  " + "\n  ".join(tail))
                r["label"] = label
                r["child_s"] = round(time.monotonic() - t0, 1)
                runs.append(r)
    combined = summarize(runs, args)
    return combined


def _fmt(v: Any, spec: str = ".1f") -> str:
    return "n/a" if v is None else format(v, spec)


#: Targets on the plugin's rows: the host-time ratio to stock 0.5.17's row of
#: the same pattern, same run.
RATIO_TARGETS = {"steady": 0.15, "churn": 0.5}


def pattern_rows(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(pattern, figures)`` of one run: the split figures, or the single
    top-level one of a run made before the split (same counts every call)."""
    if r.get("patterns"):
        return [(p, r["patterns"][p]) for p in PATTERNS if p in r["patterns"]]
    if "host_us" in r:
        return [("steady", r)]
    return []


def evaluate_targets(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ours = [r for r in runs if r.get("fill") == "plugin" and "host_us" in r]
    base = [
        r
        for r in runs
        if r.get("mode") == "stock"
        and str(r.get("sglang", "")).startswith("0.5.17")
        and "host_us" in r
    ]

    def verdict(vals: list[bool | None]) -> str:
        if not vals or any(v is None for v in vals):
            return "n/a"
        return "met" if all(vals) else "NOT met"

    rows = [(r, p, f) for r in ours for p, f in pattern_rows(r)]
    busy = [None if f["busy"] is None else f["busy"]["host_ms"] for _, _, f in rows]
    allocs = [f.get("device_allocs_per_step") for _, _, f in rows]
    labels = [f"{r.get('sglang')} {p}" for r, p, _ in rows]
    out = [
        {
            "target": "host blocked <= 1 ms while GPU busy",
            "rows": labels,
            "values": busy,
            "verdict": verdict([None if b is None else b <= 1.0 for b in busy]),
        },
        {
            "target": "0 device allocations per step",
            "rows": labels,
            "values": allocs,
            "verdict": verdict([None if a is None else a == 0 for a in allocs]),
        },
    ]
    pinned = [r.get("host_buffers_pinned") for r in ours]
    out.append(
        {
            "target": "host buffers page-locked (is_pinned())",
            "rows": [str(r.get("sglang")) for r in ours],
            "values": pinned,
            "verdict": verdict(pinned),
        }
    )
    for pattern, limit in RATIO_TARGETS.items():
        ref_rows = dict(pattern_rows(base[0])) if base else {}
        ref = ref_rows[pattern]["host_us"]["median"] if pattern in ref_rows else None
        mine = [(r, f) for r, p, f in rows if p == pattern]
        meds = [f["host_us"]["median"] for _, f in mine]
        ratios = [None if ref is None else m / ref for m in meds]
        out.append(
            {
                "target": (
                    f"{pattern} median <= {limit}x stock 0.5.17 {pattern} median "
                    "(same run)"
                ),
                "pattern": pattern,
                "limit": limit,
                "rows": [str(r.get("sglang")) for r, _ in mine],
                "values": meds,
                "reference_us": ref,
                "ratios": ratios,
                "verdict": verdict([None if x is None else x <= limit for x in ratios]),
            }
        )
    return out


def render_table(runs: list[dict[str, Any]]) -> str:
    head = [
        "fill",
        "sglang",
        "counts",
        "host µs median",
        "host µs p90",
        "host ms while GPU busy",
        "device allocs/step",
        "DP fields",
    ]
    rows = []
    for r in runs:
        if "error" in r:
            rows.append(
                [r.get("fill", "?"), r["label"], "-", "-", "-", "-", "-", r["error"]]
            )
            continue
        for pattern, f in pattern_rows(r):
            rows.append(
                [
                    r["fill"],
                    r["sglang"],
                    pattern,
                    _fmt(f["host_us"]["median"]),
                    _fmt(f["host_us"]["p90"]),
                    _fmt(None if f["busy"] is None else f["busy"]["host_ms"], ".3f"),
                    _fmt(f["device_allocs_per_step"], ".2f"),
                    r["dp_fields"],
                ]
            )
    return "\n".join(common.table_lines(head, rows))


def render_targets(targets: list[dict[str, Any]]) -> str:
    parts = []
    for t in targets:
        text = f"{t['target']}: {t['verdict']}"
        ratios = [x for x in t.get("ratios") or [] if x is not None]
        if ratios:
            text += " (" + ", ".join(f"{x:.2f}x" for x in ratios) + ")"
        parts.append(text)
    return "targets (plugin fill rows): " + "; ".join(parts)


def render_explain(r: dict[str, Any]) -> str:
    lines = [f"explain (sglang {r.get('sglang')}, {r.get('device')}):"]
    for row in r["explain"]:
        blocks = {True: "BLOCKS", False: "async", None: "n/a"}[row["blocks"]]
        lines.append(
            f"  {row['statement']:<62} idle {row['idle_us']:8.1f} µs   "
            f"behind busy GPU {_fmt(row['busy_host_ms'], '.3f'):>8} ms  {blocks}"
        )
    return "\n".join(lines)


def summarize(runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    device_name = next((r["device_name"] for r in runs if "device_name" in r), None)
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "device": args.device,
        "device_name": device_name,
        "torch": next((r["torch"] for r in runs if "torch" in r), None),
        "sglang_versions": sorted({r["sglang"] for r in runs if "sglang" in r}),
        "params": {
            "iters": args.iters,
            "dp": args.dp,
            "bs": args.bs,
            "gamma": args.gamma,
        },
        "runs": runs,
        "targets": evaluate_targets(runs),
    }


def print_compare(combined: dict[str, Any]) -> None:
    for r in combined["runs"]:
        if r.get("explain"):
            print(render_explain(r))
            print()
    print(
        f"device: {combined['device_name']}  torch {combined['torch']}  "
        f"params {combined['params']}"
    )
    print(render_table(combined["runs"]))
    print(render_targets(combined["targets"]))


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Benchmark DSpark's draft DP/EP metadata fill (stock vs plugin)."
    )
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="default: cuda if available, else cpu")  # fmt: skip
    p.add_argument("--iters", type=int, default=3000)
    p.add_argument("--dp", type=int, default=4)
    p.add_argument("--bs", type=int, default=8)
    p.add_argument("--gamma", type=int, default=None,
                   help="draft block width (default: the suite's, drivers.DRAFT_WIDTH)")  # fmt: skip
    p.add_argument("--mode", choices=MODES, default="stock",
                   help="single run: stock fill, plugin (instrument(apply=True)), "
                   "or auto (sglang.srt.plugins.load_plugins())")  # fmt: skip
    p.add_argument("--explain", action="store_true",
                   help="also time each candidate statement of the fills alone")  # fmt: skip
    p.add_argument("--out", default=None, help="write the JSON here")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("compare", help="one child per (SGLang, mode), one table")
    c.add_argument("--python", action="append", default=[], metavar="LABEL=PYTHON",
                   help="an interpreter with that SGLang installed")  # fmt: skip
    c.add_argument("--site", action="append", default=[], metavar="LABEL=DIR",
                   help="run sys.executable with PYTHONPATH=DIR:<repo>/python")  # fmt: skip
    c.add_argument("--modes", nargs="+", choices=MODES, default=["stock", "plugin"])
    c.add_argument("--child-timeout", type=float, default=600)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.device is None:
        with contextlib.suppress(Exception):
            import torch

            args.device = "cuda" if torch.cuda.is_available() else "cpu"
        args.device = args.device or "cpu"
    if args.command == "compare":
        combined = run_compare(args)
        if args.out:
            Path(args.out).write_text(
                json.dumps(combined, indent=1, default=str) + "\n"
            )
        print_compare(combined)
        return 0 if all("error" not in r for r in combined["runs"]) else 1
    result = run_worker(args)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    else:
        print(json.dumps(result, indent=1, default=str))
    if result.get("explain"):
        print(render_explain(result), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
