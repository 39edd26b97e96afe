"""HTTP requests, log checks and the report of the DSpark e2e run (stdlib only).

``e2e/run_e2e.sh`` calls one subcommand per step; every check subcommand
records one row (seen / failed / not run + evidence, and figures where it
measures some) in a results JSON file, and ``report`` merges the rows of
every part's file and renders them as markdown. Exit status 0 means the
check was seen, 1 that it failed.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import socket
import statistics
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))  # the plugin's repair names

SEEN, FAILED, NOT_RUN = "seen", "failed", "not run"

# Format strings read from SGLang 0.5.16:
# model_runner_components/cuda_graph_setup.py logs
#   "Capture {role} {verify|decode} CUDA graph end. elapsed=..."
# scheduler_components/metrics_reporter.py logs
#   "Decode batch, #running-req: N, ..., cuda graph: {bool}, gen throughput ..."
# under the scheduler prefix "[<time> DP{d} TP{t} EP{e}]".
CAPTURE_END = re.compile(
    r"Capture (?P<role>target|draft) (?P<kind>verify|decode|prefill) "
    r"CUDA graph end\."
)
DECODE_LINE = re.compile(
    r"\[[^\]]*?\bDP(?P<dp>\d+)\b[^\]]*\].*?Decode batch\b.*?"
    r"cuda graph: (?P<graph>True|False)"
)
PLUGIN_CRASH = "TypeError: 'NoneType' object is not iterable"
# The consensus watch's lines (sglang_dspark_dp.watch): one per group it
# watches, and the critical line on a mismatch:
#   "... watch: ranks [0, 1] part ways on the D decision at S: rank 0: V0;
#    rank 1: V1; CHANGES"
WATCHING_LINE = re.compile(
    r"sglang-dspark-dp: watch: watching ranks \[(?P<ranks>[\d, ]+)\]"
)
ALARM_LINE = re.compile(
    r"sglang-dspark-dp: watch: ranks \[(?P<ranks>[\d, ]+)\] part ways on "
    r"(?P<what>the (?P<decision>.+?) decision|the order of decisions \(.+?\)) "
    r"at (?P<step>.+?): (?P<values>rank \d+: .*)$"
)

# Fixed token-id prompts: four hand-made ones, then seeded random ones of
# growing length (ids 3..2046: no bos/eos/pad, not the mask token 2047).
PROMPT_SEED = 24
NUM_PROMPTS = 20


def make_prompts(n: int = NUM_PROMPTS, seed: int = PROMPT_SEED) -> list[list[int]]:
    fixed = [
        [48, 293, 288, 742, 691, 1287, 17, 20, 283, 685],
        [3 + (7 * i) % 2000 for i in range(40)],
        [100, 200, 300, 400, 500, 600, 700, 800],
        [5 + (13 * i) % 1900 for i in range(130)],
    ]
    rng = random.Random(seed)
    rest = [[rng.randrange(3, 2047) for _ in range(4 + 12 * i)] for i in range(n - 4)]
    return (fixed + rest)[:n]


PROMPTS: list[list[int]] = make_prompts()

#: The plugin's log line of one repair, and the e2e init hook's line (one per
#: process that loads plugins: e2e/hook/sglang_dspark_dp_e2e_init.py).
PLUGIN_ANY = "sglang-dspark-dp: "
#: The line every process that loads the plugin logs first (plugin.register).
ARMED_LINE = re.compile(r"sglang-dspark-dp: \d+ repairs armed on sglang ")
HOOK_LINE = re.compile(r"sglang-dspark-dp-e2e: pid (?P<pid>\d+): (?P<rest>.*)")
SKIPPED_PLUGIN = "Skipping plugin dspark_dp"
ACCEPT_LEN = re.compile(r"accept len: (?P<len>[0-9.]+)")


def repair_names() -> list[str]:
    from sglang_dspark_dp.registry import names

    return names()


def status_line() -> re.Pattern[str]:
    """A repair's status line (``Status.line()``: repair, then an outcome),
    the outcomes read from the plugin."""
    from sglang_dspark_dp.outcome import Outcome

    outcomes = "|".join(re.escape(o.value) for o in Outcome)
    return re.compile(
        rf"sglang-dspark-dp: (?P<repair>[a-z][a-z-]*): (?P<outcome>{outcomes})\b"
    )


# ---------------------------------------------------------------- pure parts


def find_capture_ends(lines: Iterable[str]) -> dict[str, list[str]]:
    """``{"target": [...], "draft": [...]}``: the capture-end lines by role."""
    found: dict[str, list[str]] = {"target": [], "draft": []}
    for line in lines:
        m = CAPTURE_END.search(line)
        if m and m.group("kind") != "prefill":
            found[m.group("role")].append(line.rstrip("\n"))
    return found


def decode_graph_by_dp(lines: Iterable[str]) -> dict[int, dict[str, Any]]:
    """Per DP rank: count of decode lines with cuda graph True/False + sample."""
    ranks: dict[int, dict[str, Any]] = {}
    for line in lines:
        m = DECODE_LINE.search(line)
        if not m:
            continue
        r = ranks.setdefault(int(m.group("dp")), {"True": 0, "False": 0})
        r[m.group("graph")] += 1
        if m.group("graph") == "True":
            r.setdefault("evidence", line.rstrip("\n"))
    return ranks


def check_decode_graph(ranks: dict[int, dict[str, Any]], dp: int) -> tuple[bool, str]:
    missing = [d for d in range(dp) if ranks.get(d, {}).get("True", 0) == 0]
    summary = ", ".join(
        f"DP{d}: True={r['True']} False={r['False']}" for d, r in sorted(ranks.items())
    )
    if missing:
        return False, f"no 'cuda graph: True' decode line on DP {missing}; {summary}"
    return True, f"{summary}; e.g. {ranks[0]['evidence']}"


def compare_outputs(a: list[dict], b: list[dict]) -> tuple[bool, str]:
    """Greedy outputs identical (token ids when present, else text)."""
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} outputs"
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        kx = x.get("output_ids") if x.get("output_ids") is not None else x.get("text")
        ky = y.get("output_ids") if y.get("output_ids") is not None else y.get("text")
        if kx != ky:
            return False, f"prompt {i} differs: {str(kx)[:120]} != {str(ky)[:120]}"
    n = sum(len(x.get("output_ids") or []) for x in a)
    return True, f"{len(a)} prompts identical ({n} output tokens)"


def find_line(lines: Iterable[str], needle: str) -> str | None:
    for line in lines:
        if needle in line:
            return line.rstrip("\n")
    return None


def gsm8k_errors(result: dict[str, Any]) -> tuple[bool, str]:
    summary = result.get("summary", result)
    if "num_errors" not in summary:
        return False, "no num_errors in the GSM8K result file"
    n, errors = summary["num_errors"], summary.get("errors", {})
    ok = n == 0 and summary.get("num_questions", 0) > 0
    return ok, (
        f"questions={summary.get('num_questions')} errors={n} {errors or ''} "
        f"accuracy={summary.get('accuracy')}"
    ).strip()


def count_plugin_lines(lines: Iterable[str]) -> dict[str, Any]:
    """The e2e hook's lines (one per process that loads plugins), the
    plugin's status lines per repair, its other lines, and SGLang's
    'skipping' lines."""
    status = status_line()
    pids: list[str] = []
    per_repair: dict[str, list[str]] = {}
    other: list[str] = []
    armed: list[str] = []
    skipped = 0
    for line in lines:
        hook = HOOK_LINE.search(line)
        if hook:
            pids.append(hook.group("pid"))
            continue
        m = status.search(line)
        if ARMED_LINE.search(line):
            armed.append(line.strip())
        elif m:
            per_repair.setdefault(m.group("repair"), []).append(line.strip())
        elif PLUGIN_ANY in line:
            other.append(line.strip())
        if SKIPPED_PLUGIN in line:
            skipped += 1
    return {
        "pids": pids,
        "armed": armed,
        "repairs": per_repair,
        "other": other,
        "skipped": skipped,
    }


def check_plugin_lines(
    counted: dict[str, Any], repairs: list[str], plugin_on: bool, dspark: bool = True
) -> tuple[bool, str, dict[str, Any]]:
    """Plugin on: the armed line once in every process that loads plugins;
    with DSpark (``dspark``), every repair's line once in every one of them
    but the HTTP process, which never imports DSpark (the scheduler
    processes); without, no repair line. Plugin off: no plugin line, SGLang
    says it skipped it."""
    processes = len(counted["pids"])
    armed = len(counted.get("armed", []))
    per = {r: len(counted["repairs"].get(r, [])) for r in repairs}
    other = sorted(set(counted["repairs"]) - set(repairs))
    values = {
        "processes": processes,
        "armed": armed,
        "lines": per,
        "skipped": counted["skipped"],
    }
    head = f"{processes} processes load plugins (pids {' '.join(counted['pids'])})"
    lines = counted.get("other", [])
    values["other_lines"] = lines
    if plugin_on:
        want = processes - 1 if dspark else 0
        ok = (
            processes > (1 if dspark else 0)
            and armed == processes
            and all(n == want for n in per.values())
            and not other
        )
        shown = ", ".join(f"{r} {n}" for r, n in per.items())
        sample = next(iter(counted["repairs"].values()), [""])[0]
        extra = f"; unknown repair lines {other}" if other else ""
        extra += f"; {len(lines)} other plugin lines, e.g. {lines[0]}" if lines else ""
        where = (
            f"{want} expected, every process but the HTTP one"
            if dspark
            else "none expected: no DSpark"
        )
        return (
            ok,
            f"{head}; armed lines {armed}; lines per repair ({where}): {shown}"
            f"{extra}; e.g. {sample}",
            values,
        )
    # SGLang's "skipping" line is INFO and may come before its logging is
    # set up: shown, not required.
    total = sum(len(v) for v in counted["repairs"].values()) + len(lines) + armed
    ok = processes > 0 and total == 0
    return (
        ok,
        f"{head}; plugin lines: {total}; '{SKIPPED_PLUGIN}' lines: "
        f"{counted['skipped']}",
        values,
    )


def accept_lengths(lines: Iterable[str]) -> list[float]:
    """The ``accept len`` of every decode log line."""
    out = []
    for line in lines:
        if "Decode batch" in line:
            m = ACCEPT_LEN.search(line)
            if m:
                out.append(float(m.group("len")))
    return out


def greedy_accept(outputs: list[dict]) -> dict[str, Any] | None:
    """Accept length over the greedy requests: output tokens per verify
    step, from their ``meta_info`` (None without speculation)."""
    tokens = steps = 0
    per_prompt = []
    for o in outputs:
        meta = o.get("meta_info") or {}
        ct, verify = meta.get("completion_tokens"), meta.get("spec_verify_ct")
        if not ct or not verify:
            continue
        tokens, steps = tokens + ct, steps + verify
        per_prompt.append(round(ct / verify, 2))
    if not steps:
        return None
    return {"accept_length": round(tokens / steps, 3), "per_prompt": per_prompt}


def check_accept(
    log_lens: list[float], greedy: dict[str, Any] | None, block: int
) -> tuple[bool, str, dict[str, Any]]:
    """The draft is accepted sometimes (length > 1) and rejected sometimes
    (some request below the full ``block`` = gamma + 1)."""
    if greedy is None:
        return False, "no spec_verify_ct in the greedy outputs", {}
    per = greedy["per_prompt"]
    values = {"greedy": greedy["accept_length"], "per_prompt": per}
    if log_lens:
        values["log_median"] = statistics.median(log_lens)
        values["log_min"], values["log_max"] = min(log_lens), max(log_lens)
    accepted = greedy["accept_length"] > 1.0
    rejected = min(per) < block
    ev = (
        f"accept length {greedy['accept_length']} over {len(per)} greedy prompts "
        f"(per prompt {min(per)}-{max(per)}, full block {block}); decode log "
        + (
            f"accept len median {values['log_median']} "
            f"({values['log_min']}-{values['log_max']}, {len(log_lens)} lines)"
            if log_lens
            else "has no accept len"
        )
        + f"; draft accepted sometimes: {accepted}, rejected sometimes: {rejected}"
    )
    return accepted and rejected, ev, values


def short_cycle(ids: list[int], period: int = 2, tail: int = 8) -> bool:
    """Whether the output ends in a cycle of ``period`` tokens or fewer
    (what U(-1e-3, 1e-3) dummy weights give)."""
    if len(ids) < tail + period:
        return False
    end = ids[-tail:]
    return any(
        all(end[i] == end[i + p] for i in range(tail - p)) for p in range(1, period + 1)
    )


def check_diversity(outputs: list[dict]) -> tuple[bool, str, dict[str, Any]]:
    """Greedy outputs that mean something: they differ by prompt, and most
    do not end in a 2-token cycle."""
    ids = [tuple(o.get("output_ids") or ()) for o in outputs]
    distinct = len(set(ids))
    cycling = sum(short_cycle(list(i)) for i in ids)
    firsts = len({i[:1] for i in ids})
    values = {"prompts": len(ids), "distinct": distinct, "cycling": cycling}
    ok = len(ids) > 0 and distinct == len(ids) and cycling <= len(ids) // 4
    return (
        ok,
        f"{distinct}/{len(ids)} distinct outputs, {firsts} distinct first tokens, "
        f"{cycling} end in a cycle of <= 2 tokens; e.g. {list(ids[0][:12])}",
        values,
    )


def compare_detail(a: list[dict], b: list[dict]) -> tuple[bool, str, dict[str, Any]]:
    """Like :func:`compare_outputs`, counting identical prompts and where
    the others first differ."""
    if len(a) != len(b):
        return False, f"{len(a)} vs {len(b)} outputs", {}
    same, first_diff = 0, []
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        kx, ky = x.get("output_ids"), y.get("output_ids")
        if kx is None or ky is None:
            first_diff.append((i, "missing"))
            continue
        if kx == ky:
            same += 1
            continue
        pos = next(
            (j for j, (p, q) in enumerate(zip(kx, ky, strict=False)) if p != q), None
        )
        first_diff.append((i, min(len(kx), len(ky)) if pos is None else pos))
    tokens = sum(len(x.get("output_ids") or []) for x in a)
    values = {"identical": same, "prompts": len(a), "first_diff": first_diff}
    ev = f"{same}/{len(a)} prompts identical ({tokens} output tokens)"
    if first_diff:
        ev += "; differ (prompt, first position): " + ", ".join(
            f"({i}, {p})" for i, p in first_diff[:8]
        )
    return same == len(a), ev, values


BENCH_FIELDS = ("output_throughput", "median_ttft_ms", "median_itl_ms")
BENCH_PROMPTS = 64
BENCH_SEED = 24


def parse_alarm(line: str) -> dict[str, Any] | None:
    """The watch's alarm line's parts: the ranks, the decision, the step,
    each rank's value and the upstream-change text; None if ``line`` is
    not one (or a part is missing: no value for a rank it names)."""
    m = ALARM_LINE.search(line)
    if not m:
        return None
    ranks = [int(r) for r in m.group("ranks").split(",")]
    rest = m.group("values")
    values: dict[int, str] = {}
    for i, rank in enumerate(ranks):
        head = f"rank {rank}: "
        if not rest.startswith(head):
            return None
        rest = rest[len(head) :]
        end = f"; rank {ranks[i + 1]}: " if i + 1 < len(ranks) else "; "
        cut = rest.find(end)
        if cut < 0:
            return None
        values[rank] = rest[:cut]
        rest = rest[cut + 2 :]
    return {
        "ranks": ranks,
        "decision": m.group("decision") or m.group("what"),
        "step": m.group("step"),
        "values": values,
        "changes": rest,
    }


def check_watch(lines: Iterable[str], gpus: int) -> tuple[bool, str, dict[str, Any]]:
    """``watch: no alarm``: the plugin server ran with the watch on and no
    rank logged an alarm. With more than one GPU the watch must have said
    it was watching (a group of one rank has nothing to compare)."""
    watching: list[str] = []
    alarms: list[str] = []
    for line in lines:
        if ALARM_LINE.search(line) or "sglang-dspark-dp: watch: ranks" in line:
            alarms.append(line.strip())
        elif WATCHING_LINE.search(line):
            watching.append(line.strip())
    values = {"watching": len(watching), "alarms": len(alarms), "gpus": gpus}
    if alarms:
        return False, f"{len(alarms)} alarm lines, first: {alarms[0]}", values
    if gpus > 1 and not watching:
        return (
            False,
            f"{gpus} GPUs and no 'watching ranks' line: the watch was not on",
            values,
        )
    shown = f"; e.g. {watching[0]}" if watching else " (one GPU: no group to watch)"
    return True, f"no alarm; {len(watching)} groups watched{shown}", values


def check_alarm_format(lines: Iterable[str]) -> tuple[bool, str, dict[str, Any]]:
    """Every alarm line in ``lines`` names the ranks, the decision, the
    step, a value for each rank and the upstream change (at least one)."""
    found = [ln.strip() for ln in lines if "sglang-dspark-dp: watch: ranks" in ln]
    if not found:
        return False, "no alarm line to read", {"alarms": 0}
    bad = []
    parsed = []
    for line in found:
        got = parse_alarm(line)
        if got is None or not got["changes"] or len(got["values"]) < 2:
            bad.append(line)
        else:
            parsed.append(got)
    values = {"alarms": len(found), "unreadable": len(bad)}
    if bad:
        return False, f"{len(bad)} of {len(found)} unreadable, first: {bad[0]}", values
    first = parsed[0]
    return (
        True,
        f"{len(found)} alarm lines read; first: {first['decision']} at "
        f"{first['step']}, ranks {first['ranks']}, change: {first['changes']}",
        values,
    )


def bench_args(port: int, tokenizer: str, output_file: str) -> list[str]:
    """``sglang.benchmark.serving`` arguments of one round: random token ids
    through the tiny model's own tokenizer (nothing to download), the same
    seed on every server."""
    return [
        "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port),
        "--tokenizer", tokenizer, "--dataset-name", "random-ids",
        "--random-input-len", "256", "--random-output-len", "128",
        "--random-range-ratio", "1.0", "--num-prompts", str(BENCH_PROMPTS),
        "--max-concurrency", "16", "--seed", str(BENCH_SEED), "--disable-tqdm",
        "--output-file", output_file,
    ]  # fmt: skip


def bench_rounds(path: Path) -> list[dict[str, Any]]:
    """The rows ``sglang.benchmark.serving --output-file`` appended, one a
    round."""
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check_bench(rounds: list[dict], want: int, num_prompts: int):
    """Every round completed all its requests; the figures of each round."""
    figures = [{k: r.get(k) for k in (*BENCH_FIELDS, "completed")} for r in rounds]
    incomplete = [i for i, r in enumerate(rounds) if r.get("completed") != num_prompts]
    ok = len(rounds) == want and not incomplete
    ev = "; ".join(
        f"round {i + 1}: {f['output_throughput']:.0f} tok/s, TTFT "
        f"{f['median_ttft_ms']:.1f} ms, ITL {f['median_itl_ms']:.2f} ms, "
        f"{f['completed']}/{num_prompts} done"
        for i, f in enumerate(figures)
    )
    if len(rounds) != want:
        ev = f"{len(rounds)} of {want} rounds ran; " + ev
    return ok, ev, {"rounds": figures}


def ratio_rows(a: list[dict], b: list[dict]) -> list[dict[str, float]]:
    """Per round, each bench figure of ``a`` over ``b``."""
    out = []
    for x, y in zip(a, b, strict=False):
        out.append(
            {
                k: round(x[k] / y[k], 3) if y.get(k) else float("nan")
                for k in BENCH_FIELDS
            }
        )
    return out


def server_args(
    gpus: int,
    spec: bool,
    *,
    port: int,
    target: str,
    draft: str,
    graph_bs: int,
) -> list[str]:
    """The ``sglang serve`` arguments of one e2e server. One GPU: TP 1.
    Several: DP attention over all of them, EP as wide (attention TP 1)."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: at least 1")
    args = ["serve", "--model-path", target, "--load-format", "dummy"]
    if gpus > 1:
        args += ["--tp-size", str(gpus), "--dp-size", str(gpus)]
        args += ["--enable-dp-attention", "--enable-dp-lm-head"]
        args += ["--ep-size", str(gpus)]
    args += ["--cuda-graph-max-bs-decode", str(graph_bs)]
    args += ["--host", "127.0.0.1", "--port", str(port)]
    args += ["--mem-fraction-static", "0.5", "--context-length", "4096"]
    if spec:
        args += ["--speculative-algorithm", "DSPARK"]
        args += ["--speculative-draft-model-path", draft]
    return args


def record(
    path: Path,
    name: str,
    status: str,
    evidence: str,
    values: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Insert or replace the row ``name`` in the results file."""
    data = json.loads(path.read_text()) if path.exists() else {"checks": []}
    rows = [r for r in data["checks"] if r["check"] != name]
    row = {"check": name, "status": status, "evidence": evidence.strip()}
    if values:
        row["values"] = values
    rows.append(row)
    data["checks"] = rows
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def render_markdown(data: dict[str, Any], title: str = "DSpark e2e results") -> str:
    out = [f"# {title}", ""]
    for key, value in data.get("meta", {}).items():
        out.append(f"- {key}: {value}")
    if data.get("meta"):
        out.append("")
    out += ["| check | status | evidence |", "|---|---|---|"]
    for r in data["checks"]:
        ev = r["evidence"].replace("|", "\\|").replace("\n", " ")
        out.append(f"| {r['check']} | {r['status']} | {ev} |")
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------- HTTP parts


def _post(url: str, payload: dict, timeout: float) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        return 0, str(exc).encode()


def wait_health(url: str, timeout: float, pid: int | None) -> tuple[bool, str, dict]:
    import os

    start = time.monotonic()
    last = ""
    while time.monotonic() - start < timeout:
        if pid is not None:
            try:
                os.kill(pid, 0)
            except OSError:
                return False, f"server process {pid} exited before /health passed", {}
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    ready = time.monotonic() - start
                    return True, f"/health 200 after {ready:.0f} s", {"ready_s": ready}
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(1)
    return False, f"/health not 200 within {timeout:.0f} s ({last})", {}


def generate(url: str, ids: list[int], max_new: int, stream: bool = False) -> dict:
    payload = {
        "input_ids": ids,
        "sampling_params": {
            "temperature": 0,
            "max_new_tokens": max_new,
            "ignore_eos": True,
        },
        "stream": stream,
    }
    status, body = _post(url + "/generate", payload, timeout=600)
    out: dict[str, Any] = {"status": status}
    if status != 200:
        out["error"] = body[:300].decode(errors="replace")
        return out
    if not stream:
        data = json.loads(body)
        out.update(
            text=data.get("text"),
            output_ids=data.get("output_ids"),
            meta_info=_meta(data.get("meta_info") or {}),
        )
        return out
    chunks = [
        c[len(b"data: ") :]
        for c in body.split(b"\n")
        if c.startswith(b"data: ") and c.strip() != b"data: [DONE]"
    ]
    out["chunks"] = len(chunks)
    if chunks:
        last = json.loads(chunks[-1])
        out.update(text=last.get("text"), output_ids=last.get("output_ids"))
    return out


def _meta(meta: dict) -> dict:
    keep = ("completion_tokens", "spec_verify_ct", "spec_accept_length")
    return {k: meta[k] for k in keep if k in meta}


# ---------------------------------------------------------------- the port

#: What a port on the loopback looks like to a server about to bind it.
PORT_FREE, PORT_TIME_WAIT = "free", "free but closing (TIME_WAIT)"
PORT_LISTENER = "taken: a listener answers"
PORT_NO_LISTENER = (
    "taken: no listener (a socket bound, or closing without SO_REUSEADDR)"
)


def _binds(host: str, port: int, reuse: bool) -> bool:
    with socket.socket() as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def port_state(port: int, host: str = "127.0.0.1") -> str:
    """The port as the server sees it. SGLang's own port check and the HTTP
    server's listener (asyncio's ``create_server``) bind with
    ``SO_REUSEADDR``; on Linux a listener blocks such a bind, and a socket
    in TIME_WAIT does not when it had ``SO_REUSEADDR`` too, as a stopped
    server's connections did (they stay in TIME_WAIT up to a minute). A
    plain bind tells TIME_WAIT from free, a connect a listener from a
    socket that only holds the port."""
    if _binds(host, port, reuse=True):
        return PORT_FREE if _binds(host, port, reuse=False) else PORT_TIME_WAIT
    with socket.socket() as s:
        s.settimeout(2)
        return PORT_LISTENER if s.connect_ex((host, port)) == 0 else PORT_NO_LISTENER


def wait_port(
    port: int, wait: float, poll: float = 0.5, host: str = "127.0.0.1"
) -> tuple[bool, str, dict[str, Any]]:
    """Whether a server can bind ``port``, waiting up to ``wait`` seconds
    for one that is taken to close (a stopped server's last process)."""
    start = time.monotonic()
    polls, state = 0, port_state(port, host)
    while state.startswith("taken") and time.monotonic() - start < wait:
        time.sleep(poll)
        polls, state = polls + 1, port_state(port, host)
    waited = time.monotonic() - start
    ok = not state.startswith("taken")
    ev = f"port {port}: {state}" + (
        f" after {polls} polls ({waited:.1f} s, waiting up to {wait:g} s)"
        if polls
        else ""
    )
    return ok, ev, {"state": state, "polls": polls}


# ---------------------------------------------------------------- commands


def _lines(path: str) -> list[str]:
    return Path(path).read_text(errors="replace").splitlines()


def _load(path: str) -> Any:
    return json.loads(Path(path).read_text())


def cmd_health(a: argparse.Namespace):
    ok, ev, values = wait_health(a.url, a.timeout, a.pid)
    if ok and a.variant:
        values["variant"] = a.variant
    return ok, ev, values


def cmd_capture(a: argparse.Namespace) -> tuple[bool, str]:
    found = find_capture_ends(_lines(a.log))
    ok = bool(found["target"]) and bool(found["draft"] or not a.require_draft)
    ev = f"target={len(found['target'])} draft={len(found['draft'])}; " + " / ".join(
        v[0] for v in found.values() if v
    )
    return ok, ev


def cmd_stream(a: argparse.Namespace) -> tuple[bool, str]:
    r = generate(a.url, PROMPTS[0], 32, stream=True)
    ok = r["status"] == 200 and r.get("chunks", 0) > 1
    return ok, f"status={r['status']} chunks={r.get('chunks')} {r.get('error', '')}"


def cmd_concurrent(a: argparse.Namespace) -> tuple[bool, str]:
    prompts = [PROMPTS[i % len(PROMPTS)][: 8 + i] for i in range(a.n)]
    with ThreadPoolExecutor(a.n) as pool:
        results = list(pool.map(lambda p: generate(a.url, p, 32), prompts))
    codes = [r["status"] for r in results]
    bad = [r.get("error", "") for r in results if r["status"] != 200]
    ok = not bad
    return ok, f"{codes.count(200)}/{a.n} returned 200 {bad[:1] if bad else ''}"


def cmd_decode_graph(a: argparse.Namespace) -> tuple[bool, str]:
    lines = _lines(a.log)
    if a.dp == 1:  # no DP attention: the log prefix names no DP rank
        decode = [ln for ln in lines if "Decode batch" in ln and "cuda graph:" in ln]
        on = [ln for ln in decode if "cuda graph: True" in ln]
        ev = f"{len(on)} of {len(decode)} decode lines on CUDA graph"
        return bool(on), ev + (f"; e.g. {on[0].strip()}" if on else "")
    return check_decode_graph(decode_graph_by_dp(lines), a.dp)


def cmd_greedy(a: argparse.Namespace) -> tuple[bool, str]:
    outs = [generate(a.url, p, a.max_new_tokens) for p in PROMPTS]
    Path(a.save).write_text(json.dumps(outs, indent=1) + "\n")
    bad = [o for o in outs if o["status"] != 200]
    return (
        not bad,
        f"{len(outs) - len(bad)}/{len(outs)} greedy prompts "
        f"({a.max_new_tokens} tokens each) saved to {Path(a.save).name}",
    )


def cmd_compare(a: argparse.Namespace):
    return compare_detail(_load(a.a), _load(a.b))


def cmd_diversity(a: argparse.Namespace):
    return check_diversity(_load(a.greedy))


def cmd_plugin_lines(a: argparse.Namespace):
    counted = count_plugin_lines(_lines(a.log))
    return check_plugin_lines(
        counted, repair_names(), plugin_on=a.plugin == "on", dspark=a.dspark == "yes"
    )


def cmd_watch(a: argparse.Namespace):
    return check_watch(_lines(a.log), a.gpus)


def cmd_alarm_format(a: argparse.Namespace):
    return check_alarm_format(_lines(a.log))


def cmd_accept(a: argparse.Namespace):
    return check_accept(
        accept_lengths(_lines(a.log)), greedy_accept(_load(a.greedy)), a.block
    )


def cmd_bench(a: argparse.Namespace):
    return check_bench(bench_rounds(Path(a.file)), a.rounds, BENCH_PROMPTS)


def cmd_bench_args(a: argparse.Namespace) -> tuple[bool, str]:
    print("\n".join(bench_args(a.port, a.tokenizer, a.output_file)))
    return True, ""


def cmd_ratios(a: argparse.Namespace):
    """Plugin / plugin off, per round; harmless when the median ratio of
    each figure lies within the spread the rounds of either server show."""
    on, off = bench_rounds(Path(a.plugin)), bench_rounds(Path(a.off))
    if not on or not off:
        return False, "a bench file is missing or empty", {}
    rows = ratio_rows(on, off)
    verdicts, parts = {}, []
    for k in BENCH_FIELDS:
        med = statistics.median(r[k] for r in rows)
        noise = max(_spread([x[k] for x in on]), _spread([x[k] for x in off]))
        verdicts[k] = abs(med - 1) <= noise
        shown = ", ".join(f"{r[k]:.3f}" for r in rows)
        parts.append(
            f"{k} {shown} (median {med:.3f}, rounds spread {noise:.3f}: "
            + ("within" if verdicts[k] else "OUTSIDE")
            + ")"
        )
    harmless = verdicts["output_throughput"] and verdicts["median_itl_ms"]
    return (
        harmless,
        "plugin / plugin off per round: " + "; ".join(parts),
        {
            "per_round": rows,
            "within_noise": verdicts,
        },
    )


def _spread(values: list[float]) -> float:
    """(max - min) / median of one server's rounds."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med else 0.0


def cmd_gsm8k(a: argparse.Namespace) -> tuple[bool, str]:
    p = Path(a.result_file)
    if not p.exists():
        return False, f"{p} missing (client failed)"
    ok, ev = gsm8k_errors(json.loads(p.read_text()))
    return ok, ev + " (accuracy means nothing with random weights)"


def cmd_expect_crash(a: argparse.Namespace) -> tuple[bool, str]:
    line = find_line(_lines(a.log), a.pattern)
    if line is None:
        return False, f"{a.pattern!r} not in {a.log} (health passed: {a.healthy})"
    ok = a.healthy == "no"
    return ok, f"health passed: {a.healthy}; {line}"


def cmd_port(a: argparse.Namespace):
    if a.wait < 0:
        raise ValueError(f"--wait {a.wait:g}: seconds, at least 0")
    return wait_port(a.port, a.wait)


def cmd_server_args(a: argparse.Namespace) -> tuple[bool, str]:
    args = server_args(
        a.gpus,
        a.spec == "yes",
        port=a.port,
        target=a.target,
        draft=a.draft,
        graph_bs=a.graph_bs,
    )
    print("\n".join(args))
    return True, ""


def merge_results(paths: list[Path]) -> dict[str, Any]:
    """The rows of several results files (a later file's row replaces an
    earlier one of the same name) and their metadata."""
    merged: dict[str, Any] = {"checks": [], "meta": {}}
    for path in paths:
        data = json.loads(path.read_text())
        names = {r["check"] for r in data.get("checks", [])}
        merged["checks"] = [r for r in merged["checks"] if r["check"] not in names]
        merged["checks"] += data.get("checks", [])
        merged["meta"].update(data.get("meta", {}))
    return merged


#: The variant of a server part whose /health row names none (rows files
#: written before 2026-12-07's warm-up of both kernel sets).
PART_VARIANT = {"dspark": "on", "noplugin": "off", "nospec": "nospec"}


def ready_servers(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every server that became ready: its row's part, variant (plugin
    ``on``, ``off``, or ``nospec``) and seconds to /health."""
    out = []
    for r in rows:
        values = r.get("values", {})
        if "ready_s" not in values:
            continue
        part = r["check"].split(":")[0]
        variant = values.get("variant") or PART_VARIANT.get(part, part)
        out.append({"part": part, "variant": variant, "ready_s": values["ready_s"]})
    return out


def ready_difference(servers: list[dict[str, Any]]) -> tuple[str, str, dict[str, Any]]:
    """Plugin on minus plugin off, the medians of their servers' ready
    seconds, against the spread between servers of one variant (the widest
    max - min of on or off): a start-up cost of the plugin shows only as a
    difference wider than two identical servers differ. With one server per
    variant there is no spread to compare with: not run."""
    by = {
        v: sorted(s["ready_s"] for s in servers if s["variant"] == v)
        for v in ("on", "off")
    }
    if not by["on"] or not by["off"]:
        missing = " and ".join(f"plugin {v}" for v in ("on", "off") if not by[v])
        return NOT_RUN, f"no ready {missing} server", {}
    diff = statistics.median(by["on"]) - statistics.median(by["off"])
    spreads = {v: x[-1] - x[0] for v, x in by.items() if len(x) > 1}
    shown = "; ".join(
        f"plugin {v}: " + ", ".join(f"{x:.1f}" for x in xs) + " s"
        for v, xs in by.items()
    )
    values: dict[str, Any] = {"on_minus_off_s": round(diff, 2), "ready_s": by}
    ev = f"plugin on - off {diff:+.1f} s (medians; {shown})"
    if not spreads:
        return (
            NOT_RUN,
            ev + "; one server per variant, so no spread between same-variant "
            "servers to compare with (the restart part starts more)",
            values,
        )
    spread = max(spreads.values())
    within = abs(diff) <= spread
    values.update(spread_s=round(spread, 2), within=within)
    ev += (
        f"; same-variant spread {spread:.1f} s ("
        + ", ".join(f"{v} {x:.1f}" for v, x in spreads.items())
        + "): "
        + ("within" if within else "OUTSIDE")
    )
    return (SEEN if within else FAILED), ev, values


def cmd_ready(a: argparse.Namespace):
    """Server-ready seconds of each server, from its /health row."""
    servers = ready_servers(merge_results([Path(p) for p in a.merge])["checks"])
    if not servers:
        return False, "no server became ready", {}
    ev = ", ".join(
        f"{s['part']} ({s['variant']}) {s['ready_s']:.0f} s" for s in servers
    )
    return True, ev, {"servers": servers}


def cmd_ready_diff(a: argparse.Namespace):
    status, ev, values = ready_difference(
        ready_servers(merge_results([Path(p) for p in a.merge])["checks"])
    )
    return status, ev, values


def cmd_report(a: argparse.Namespace) -> tuple[bool, str]:
    """The table of the rows files given, in their order, and nothing else:
    an ``e2e_results.json`` an earlier report wrote is overwritten, never
    read (2026-12-07: a report after call 7 read call 6's and kept its
    "not run" lossless rows over the new ones)."""
    if not a.results:
        raise ValueError("report needs --results (the merged JSON to write)")
    paths = [Path(p) for p in a.merge]
    if Path(a.results).resolve() in {p.resolve() for p in paths}:
        raise ValueError(
            f"--merge {a.results}: the report's own output is no rows file"
        )
    data = merge_results(paths)
    for kv in a.meta or []:
        key, _, value = kv.partition("=")
        data["meta"][key] = value
    Path(a.results).write_text(json.dumps(data, indent=2) + "\n")
    Path(a.md).write_text(render_markdown(data))
    failed = [r["check"] for r in data["checks"] if r["status"] == FAILED]
    return not failed, f"failed: {failed}" if failed else "no check failed"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--results", help="results JSON to record the row in")
    p.add_argument("--check", help="row name (default: the subcommand)")
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str, fn, help_: str) -> argparse.ArgumentParser:
        s = sub.add_parser(name, help=help_)
        s.set_defaults(fn=fn)
        return s

    s = add("health", cmd_health, "wait for /health")
    s.add_argument("--url", required=True)
    s.add_argument("--timeout", type=float, default=1200)
    s.add_argument("--pid", type=int)
    s.add_argument("--variant", choices=["on", "off", "nospec"], help="plugin on/off")
    s = add("capture", cmd_capture, "target + draft CUDA-graph capture ended")
    s.add_argument("--log", required=True)
    s.add_argument(
        "--require-draft", action=argparse.BooleanOptionalAction, default=True
    )
    s = add("stream", cmd_stream, "one streaming /generate")
    s.add_argument("--url", required=True)
    s = add("concurrent", cmd_concurrent, "N concurrent /generate, all 200")
    s.add_argument("--url", required=True)
    s.add_argument("--n", type=int, default=32)
    s = add("decode-graph", cmd_decode_graph, "every DP rank decodes on cuda graph")
    s.add_argument("--log", required=True)
    s.add_argument("--dp", type=int, required=True)
    s = add("greedy", cmd_greedy, "save greedy outputs of the fixed prompts")
    s.add_argument("--url", required=True)
    s.add_argument("--save", required=True)
    s.add_argument("--max-new-tokens", type=int, default=48)
    s = add("compare", cmd_compare, "two greedy output files identical")
    s.add_argument("a")
    s.add_argument("b")
    s = add("diversity", cmd_diversity, "greedy outputs differ by prompt")
    s.add_argument("greedy")
    s = add("plugin-lines", cmd_plugin_lines, "the plugin's lines per process")
    s.add_argument("--log", required=True)
    s.add_argument("--plugin", choices=["on", "off"], required=True)
    s.add_argument(
        "--dspark",
        choices=["yes", "no"],
        default="yes",
        help="whether the server runs DSpark (its schedulers log the repairs)",
    )
    s = add("watch", cmd_watch, "watch: no alarm (the watch on, every rank agreed)")
    s.add_argument("--log", required=True)
    s.add_argument("--gpus", type=int, required=True)
    s = add("alarm-format", cmd_alarm_format, "the watch's alarm lines are readable")
    s.add_argument("--log", required=True)
    s = add("accept", cmd_accept, "accept length: drafts accepted and rejected")
    s.add_argument("--log", required=True)
    s.add_argument("--greedy", required=True)
    s.add_argument("--block", type=int, default=5, help="gamma + 1")
    s = add("bench", cmd_bench, "bench_serving rounds all completed")
    s.add_argument("--file", required=True)
    s.add_argument("--rounds", type=int, required=True)
    s = add("bench-args", cmd_bench_args, "print one bench round's arguments")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--tokenizer", required=True)
    s.add_argument("--output-file", required=True)
    s = add("ratios", cmd_ratios, "plugin / plugin-off bench figures per round")
    s.add_argument("--plugin", required=True)
    s.add_argument("--off", required=True)
    s = add("gsm8k", cmd_gsm8k, "GSM8K client result has zero request errors")
    s.add_argument("--result-file", required=True)
    s = add("expect-crash", cmd_expect_crash, "log shows the expected crash")
    s.add_argument("--log", required=True)
    s.add_argument("--pattern", default=PLUGIN_CRASH)
    s.add_argument("--healthy", choices=["yes", "no"], required=True)
    s = add(
        "port", cmd_port, "a server can bind the port (TIME_WAIT can; a listener not)"
    )
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--wait", type=float, default=20, help="seconds for a port to close")
    s = add("server-args", cmd_server_args, "print the sglang serve arguments")
    s.add_argument("--gpus", type=int, required=True)
    s.add_argument("--spec", choices=["yes", "no"], required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--draft", required=True)
    s.add_argument("--graph-bs", type=int, required=True)
    s = add("record", lambda a: (a.status != FAILED, a.evidence), "record a row")
    s.add_argument("--status", choices=[SEEN, FAILED, NOT_RUN], required=True)
    s.add_argument("--evidence", default="")
    s = add("ready", cmd_ready, "server-ready seconds of every server")
    s.add_argument("--merge", nargs="+", required=True)
    s = add(
        "ready-diff", cmd_ready_diff, "ready: plugin on - off vs same-variant spread"
    )
    s.add_argument("--merge", nargs="+", required=True)
    s = add("report", cmd_report, "the rows files' rows as one table (json + md)")
    s.add_argument("--md", required=True)
    s.add_argument("--meta", action="append", help="KEY=VALUE")
    s.add_argument(
        "--merge",
        nargs="+",
        required=True,
        help="rows files, a later one's row replacing an earlier's of the same name",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    values: dict[str, Any] = {}
    status = None  # a check may name its row's status (not run) instead of ok
    try:
        out = args.fn(args)
        ok, evidence = out[0], out[1]
        if isinstance(ok, str):
            status, ok = ok, ok != FAILED
        if len(out) > 2:
            values = out[2]
    except Exception as exc:  # a check that crashes is a failed check
        ok, evidence = False, f"{type(exc).__name__}: {exc}"
    if args.cmd in ("server-args", "bench-args"):
        return 0 if ok else 1
    shown = "not run" if status == NOT_RUN else ("ok" if ok else "FAIL")
    print(f"[{shown}] {args.cmd}: {evidence}")
    if args.results and args.cmd not in ("report",):
        if args.cmd == "record":
            status = args.status
        record(
            Path(args.results),
            args.check or args.cmd,
            status or (SEEN if ok else FAILED),
            evidence,
            values,
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
