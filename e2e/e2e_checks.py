"""HTTP requests and log checks of the multi-GPU DSpark e2e run (stdlib only).

``e2e/run_e2e.sh`` calls one subcommand per step; every check subcommand
records one row (seen / failed / not run + evidence) in a results JSON file,
and ``report`` renders that file as markdown. Exit status 0 means the check
was seen, 1 that it failed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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

# Fixed token-id prompts (ids < 2047 = the tiny vocab minus the mask token).
PROMPTS: list[list[int]] = [
    [48, 293, 288, 742, 691, 1287, 17, 20, 283, 685],
    [3 + (7 * i) % 2000 for i in range(40)],
    [100, 200, 300, 400, 500, 600, 700, 800],
    [5 + (13 * i) % 1900 for i in range(130)],
]


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


def record(path: Path, name: str, status: str, evidence: str) -> dict[str, Any]:
    """Insert or replace the row ``name`` in the results file."""
    data = json.loads(path.read_text()) if path.exists() else {"checks": []}
    rows = [r for r in data["checks"] if r["check"] != name]
    rows.append({"check": name, "status": status, "evidence": evidence.strip()})
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


def wait_health(url: str, timeout: float, pid: int | None) -> tuple[bool, str]:
    import os

    deadline = time.time() + timeout
    last = ""
    while time.time() < deadline:
        if pid is not None:
            try:
                os.kill(pid, 0)
            except OSError:
                return False, f"server process {pid} exited before /health passed"
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return (
                        True,
                        f"/health 200 after {timeout - deadline + time.time():.0f} s",
                    )
        except (urllib.error.URLError, OSError) as exc:
            last = str(exc)
        time.sleep(2)
    return False, f"/health not 200 within {timeout:.0f} s ({last})"


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
        out.update(text=data.get("text"), output_ids=data.get("output_ids"))
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


# ---------------------------------------------------------------- commands


def _lines(path: str) -> list[str]:
    return Path(path).read_text(errors="replace").splitlines()


def cmd_health(a: argparse.Namespace) -> tuple[bool, str]:
    return wait_health(a.url, a.timeout, a.pid)


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
    return check_decode_graph(decode_graph_by_dp(_lines(a.log)), a.dp)


def cmd_greedy(a: argparse.Namespace) -> tuple[bool, str]:
    outs = [generate(a.url, p, a.max_new_tokens) for p in PROMPTS]
    Path(a.save).write_text(json.dumps(outs, indent=2) + "\n")
    bad = [o for o in outs if o["status"] != 200]
    return (
        not bad,
        f"{len(outs) - len(bad)}/{len(outs)} greedy prompts saved to {a.save}",
    )


def cmd_compare(a: argparse.Namespace) -> tuple[bool, str]:
    x, y = (json.loads(Path(p).read_text()) for p in (a.a, a.b))
    return compare_outputs(x, y)


def cmd_gsm8k(a: argparse.Namespace) -> tuple[bool, str]:
    p = Path(a.result_file)
    if not p.exists():
        return False, f"{p} missing (client failed)"
    return gsm8k_errors(json.loads(p.read_text()))


def cmd_expect_crash(a: argparse.Namespace) -> tuple[bool, str]:
    line = find_line(_lines(a.log), a.pattern)
    if line is None:
        return False, f"{a.pattern!r} not in {a.log} (health passed: {a.healthy})"
    ok = a.healthy == "no"
    return ok, f"health passed: {a.healthy}; {line}"


def cmd_report(a: argparse.Namespace) -> tuple[bool, str]:
    data = json.loads(Path(a.results).read_text())
    for kv in a.meta or []:
        key, _, value = kv.partition("=")
        data.setdefault("meta", {})[key] = value
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
    s.add_argument("--max-new-tokens", type=int, default=32)
    s = add("compare", cmd_compare, "two greedy output files identical")
    s.add_argument("a")
    s.add_argument("b")
    s = add("gsm8k", cmd_gsm8k, "GSM8K client result has zero request errors")
    s.add_argument("--result-file", required=True)
    s = add("expect-crash", cmd_expect_crash, "log shows the expected crash")
    s.add_argument("--log", required=True)
    s.add_argument("--pattern", default=PLUGIN_CRASH)
    s.add_argument("--healthy", choices=["yes", "no"], required=True)
    s = add("record", lambda a: (a.status != FAILED, a.evidence), "record a row")
    s.add_argument("--status", choices=[SEEN, FAILED, NOT_RUN], required=True)
    s.add_argument("--evidence", default="")
    s = add("report", cmd_report, "write the markdown summary")
    s.add_argument("--md", required=True)
    s.add_argument("--meta", action="append", help="KEY=VALUE")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        ok, evidence = args.fn(args)
    except Exception as exc:  # a check that crashes is a failed check
        ok, evidence = False, f"{type(exc).__name__}: {exc}"
    print(f"[{'ok' if ok else 'FAIL'}] {args.cmd}: {evidence}")
    if args.results and args.cmd not in ("report",):
        status = args.status if args.cmd == "record" else (SEEN if ok else FAILED)
        record(Path(args.results), args.check or args.cmd, status, evidence)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
