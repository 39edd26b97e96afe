"""Unit tests of the pure parts of e2e/e2e_checks.py (no server, no GPU)."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "e2e" / "e2e_checks.py"
_spec = importlib.util.spec_from_file_location("e2e_checks", SCRIPT)
ec = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ec)

# Lines shaped like SGLang 0.5.16's format strings (cuda_graph_setup.py,
# metrics_reporter.py, scheduler logger prefix " DP{d} TP{t} EP{e}").
LOG = """\
[2026-01-01 10:00:00 DP0 TP0 EP0] Capture target verify CUDA graph begin. \
backend=full, num_tokens_per_req=5, bs=[1, 2, 4], avail mem=120.00 GB
[2026-01-01 10:00:09 DP0 TP0 EP0] Capture target verify CUDA graph end. \
elapsed=9.10 s, mem usage=1.20 GB, avail mem=118.80 GB.
[2026-01-01 10:00:10 DP0 TP0 EP0] Capture draft decode CUDA graph end. \
elapsed=3.00 s, mem usage=0.20 GB, avail mem=118.60 GB.
[2026-01-01 10:00:10 DP1 TP1 EP1] Capture target prefill CUDA graph end. \
elapsed=1.00 s, mem usage=0.10 GB, avail mem=118.60 GB.
[2026-01-01 10:01:00 DP0 TP0 EP0] Decode batch, #running-req: 16, #token: 900, \
token usage: 0.01, accept len: 2.10, accept rate: 0.28, cuda graph: True, \
gen throughput (token/s): 900.00, #queue-req: 0
[2026-01-01 10:01:00 DP1 TP1 EP1] Decode batch, #running-req: 16, #token: 880, \
token usage: 0.01, accept len: 2.00, accept rate: 0.25, cuda graph: False, \
gen throughput (token/s): 850.00, #queue-req: 0
"""
DP1_TRUE = (
    "[2026-01-01 10:01:01.123 DP1 TP1 EP1] Decode batch, #running-req: 3, "
    "#token: 90, token usage: 0.00, cuda graph: True, "
    "gen throughput (token/s): 80.00, #queue-req: 0"
)


def test_capture_ends_by_role_ignore_prefill():
    found = ec.find_capture_ends(LOG.splitlines())
    assert len(found["target"]) == 1 and "target verify" in found["target"][0]
    assert len(found["draft"]) == 1 and "draft decode" in found["draft"][0]


def test_capture_ends_none_on_begin_only():
    found = ec.find_capture_ends(LOG.splitlines()[:1])
    assert found == {"target": [], "draft": []}


def test_decode_graph_needs_every_dp_rank():
    ranks = ec.decode_graph_by_dp(LOG.splitlines())
    assert ranks[0]["True"] == 1 and ranks[1] == {"True": 0, "False": 1}
    ok, why = ec.check_decode_graph(ranks, dp=2)
    assert not ok and "DP [1]" in why
    ok, why = ec.check_decode_graph(
        ec.decode_graph_by_dp([*LOG.splitlines(), DP1_TRUE]), dp=2
    )
    assert ok and "DP1: True=1 False=1" in why


def test_decode_line_without_dp_prefix_is_ignored():
    line = "[2026-01-01 10:01:00 TP0] Decode batch, #running-req: 1, cuda graph: True"
    assert ec.decode_graph_by_dp([line]) == {}


def test_compare_outputs():
    a = [{"output_ids": [1, 2, 3], "text": "x"}, {"output_ids": [4], "text": "y"}]
    assert ec.compare_outputs(a, json.loads(json.dumps(a)))[0]
    b = [a[0], {"output_ids": [5], "text": "y"}]
    ok, why = ec.compare_outputs(a, b)
    assert not ok and "prompt 1" in why
    assert not ec.compare_outputs(a, a[:1])[0]
    assert ec.compare_outputs([{"text": "t"}], [{"text": "t"}])[0]


def test_gsm8k_errors_top_level_and_nested():
    good = {"num_questions": 50, "num_errors": 0, "errors": {}, "accuracy": 0.0}
    assert ec.gsm8k_errors(good)[0]
    assert ec.gsm8k_errors({"summary": good})[0]
    bad = dict(good, num_errors=2, errors={"HTTP 500": 2})
    ok, why = ec.gsm8k_errors(bad)
    assert not ok and "HTTP 500" in why
    assert not ec.gsm8k_errors({})[0]


def test_find_crash_line():
    lines = ["ok", f"  File x\n{ec.PLUGIN_CRASH}", "end"]
    assert ec.PLUGIN_CRASH in ec.find_line(lines, ec.PLUGIN_CRASH)
    assert ec.find_line(["ok"], ec.PLUGIN_CRASH) is None


def test_record_replaces_row_and_renders(tmp_path):
    path = tmp_path / "r.json"
    ec.record(path, "a", ec.FAILED, "first")
    ec.record(path, "b", ec.NOT_RUN, "x | y")
    data = ec.record(path, "a", ec.SEEN, "second")
    assert [r["check"] for r in data["checks"]] == ["b", "a"]
    md = ec.render_markdown(dict(data, meta={"gpus": 2}))
    assert "| a | seen | second |" in md and "x \\| y" in md and "- gpus: 2" in md


def test_cli_record_and_report(tmp_path):
    rows, md = tmp_path / "rows.json", tmp_path / "r.md"
    run = [sys.executable, str(SCRIPT), "--results", str(rows)]
    rc = subprocess.run(
        [
            *run,
            "--check",
            "c1",
            "record",
            "--status",
            "not run",
            "--evidence",
            "no GPUs",
        ],
        capture_output=True,
    )
    assert rc.returncode == 0
    log = tmp_path / "log.txt"
    log.write_text(LOG)
    rc = subprocess.run(
        [*run, "--check", "graphs", "decode-graph", "--log", str(log), "--dp", "2"],
        capture_output=True,
    )
    assert rc.returncode == 1
    report = [sys.executable, str(SCRIPT), "--results", str(tmp_path / "r.json")]
    report += ["report", "--md", str(md), "--meta", "gpus=2", "--merge", str(rows)]
    rc = subprocess.run(report, capture_output=True)
    assert rc.returncode == 1  # one failed row
    text = md.read_text()
    assert "| c1 | not run | no GPUs |" in text and "| graphs | failed |" in text


def test_help_works():
    rc = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True
    )
    assert rc.returncode == 0 and "decode-graph" in rc.stdout


def test_prompts_inside_tiny_vocab():
    vocab = json.loads((ROOT / "e2e/models/tiny-dsv4-target/config.json").read_text())[
        "vocab_size"
    ]
    assert all(0 <= t < vocab - 1 for p in ec.PROMPTS for t in p)


# ------------------------------------------------- issue 24: one-GPU run


REPAIRS = ec.repair_names()


def plugin_log(
    processes: int, repairs=REPAIRS, hook=True, armed=True, dspark=True
) -> list[str]:
    """A server log's plugin lines: in every process that loads plugins the
    e2e hook's line and the armed line; the repairs' lines in every process
    but the first (the HTTP process never imports DSpark)."""
    lines = []
    for k, pid in enumerate(range(100, 100 + processes)):
        if hook:
            lines.append(
                f"[2026-01-01 10:00:00] sglang-dspark-dp-e2e: pid {pid}: "
                "dummy weights U(-0.035, 0.035), norms 1"
            )
        if armed:
            lines.append(
                "[2026-01-01 10:00:00] sglang-dspark-dp: 6 repairs armed on sglang "
                "0.5.17: each probes and applies when DSpark's module it patches "
                "is first imported in this process (draft-batch, ...)"
            )
        if k == 0 or not dspark:
            continue
        for r in repairs:
            lines.append(
                f"[2026-01-01 10:00:00] sglang-dspark-dp: {r}: enabled on sglang "
                "0.5.17 (#33098 in this build): ..."
            )
    return lines


def test_the_repair_names_are_the_plugins():
    from sglang_dspark_dp.registry import REPAIRS as registered

    assert REPAIRS == [name for name, _ in registered]
    assert "draft-batch" in REPAIRS


def test_only_status_lines_count_and_other_plugin_lines_are_shown():
    log = plugin_log(2) + [
        "[t] sglang-dspark-dp: startup-capture: a rank's probe failed; every rank "
        "of its group of 2 runs stock",
        "[t] sglang-dspark-dp: not applied: SGLang is not installed",
    ]
    counted = ec.count_plugin_lines(log)
    assert {r: len(v) for r, v in counted["repairs"].items()} == dict.fromkeys(
        REPAIRS, 1
    )
    assert len(counted["other"]) == 2
    ok, why, _ = ec.check_plugin_lines(counted, REPAIRS, plugin_on=True)
    assert ok and "2 other plugin lines" in why
    off = ec.count_plugin_lines(plugin_log(1, repairs=[]) + log[-1:])
    assert not ec.check_plugin_lines(off, REPAIRS, plugin_on=False)[0]


def test_plugin_lines_one_per_repair_and_process():
    ok, why, values = ec.check_plugin_lines(
        ec.count_plugin_lines(plugin_log(3)), REPAIRS, plugin_on=True
    )
    assert ok and values["processes"] == 3 and "draft-batch 2" in why
    assert values["armed"] == 3
    short = plugin_log(3)[:-1]  # one scheduler lacks the last repair's line
    ok, why, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(short), REPAIRS, plugin_on=True
    )
    assert not ok and f"{REPAIRS[-1]} 1" in why
    # The HTTP process logging the repairs too (probes where DSpark never runs).
    http_too = plugin_log(2) + [x for x in plugin_log(2) if ": enabled on " in x]
    ok, why, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(http_too), REPAIRS, plugin_on=True
    )
    assert not ok and "draft-batch 2" in why
    # A process that loads plugins without the armed line.
    unarmed = plugin_log(2)
    unarmed.remove(next(x for x in unarmed if " repairs armed on " in x))
    ok, why, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(unarmed), REPAIRS, plugin_on=True
    )
    assert not ok and "armed lines 1" in why
    ok, _, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(plugin_log(2, hook=False)), REPAIRS, plugin_on=True
    )
    assert not ok  # no process seen loading plugins
    ok, why, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(plugin_log(2, repairs=[*REPAIRS, "new-one"])),
        REPAIRS,
        plugin_on=True,
    )
    assert not ok and "new-one" in why


def test_a_server_without_dspark_logs_the_armed_lines_only():
    nospec = plugin_log(2, dspark=False)
    ok, why, values = ec.check_plugin_lines(
        ec.count_plugin_lines(nospec), REPAIRS, plugin_on=True, dspark=False
    )
    assert ok and values["armed"] == 2 and "none expected" in why
    ok, _, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(plugin_log(2)), REPAIRS, plugin_on=True, dspark=False
    )
    assert not ok  # repairs applied in a server that never imports DSpark


def test_plugin_off_means_no_plugin_line():
    off = plugin_log(2, repairs=[], armed=False) + [
        "[x] Skipping plugin dspark_dp (not in SGLANG_PLUGINS)"
    ]
    ok, why, values = ec.check_plugin_lines(
        ec.count_plugin_lines(off), REPAIRS, plugin_on=False
    )
    assert ok and values["skipped"] == 1 and "plugin lines: 0" in why
    ok, _, _ = ec.check_plugin_lines(
        ec.count_plugin_lines(plugin_log(2)), REPAIRS, plugin_on=False
    )
    assert not ok


def test_the_hooks_own_line_is_counted(capsys, monkeypatch):
    sys.path.insert(0, str(ROOT / "e2e" / "hook"))
    import sglang_dspark_dp_e2e_init as hook

    try:  # register() patches SGLang's dummy init: undone after the test
        from sglang.srt.model_loader import loader, weight_utils
    except ImportError:
        pass
    else:
        for module in (loader, weight_utils):
            monkeypatch.setattr(
                module, "initialize_dummy_weights", module.initialize_dummy_weights
            )
    hook.register()
    err = capsys.readouterr().err.splitlines()
    assert ec.count_plugin_lines(err)["pids"] == [str(__import__("os").getpid())]


def greedy_out(ids, ct=None, verify=None):
    out = {"status": 200, "output_ids": ids, "text": ""}
    if ct is not None:
        out["meta_info"] = {"completion_tokens": ct, "spec_verify_ct": verify}
    return out


def test_accept_length_needs_accepts_and_rejects():
    lines = [
        "[t] Decode batch, #running-req: 1, accept len: 1.50, accept rate: 0.1, "
        "cuda graph: True",
        "[t] Decode batch, #running-req: 1, accept len: 2.50, cuda graph: True",
        "[t] Prefill batch, accept len: 9.00",
    ]
    assert ec.accept_lengths(lines) == [1.5, 2.5]
    outs = [greedy_out([1], 48, 30), greedy_out([2], 48, 12)]
    ok, why, values = ec.check_accept(
        ec.accept_lengths(lines), ec.greedy_accept(outs), block=5
    )
    assert ok and values["greedy"] == round(96 / 42, 3) and "median 2.0" in why
    all_full = [greedy_out([1], 50, 10)]  # 5 per step: never rejected
    assert not ec.check_accept([], ec.greedy_accept(all_full), block=5)[0]
    none = [greedy_out([1], 48, 48)]  # 1 per step: never accepted
    assert not ec.check_accept([], ec.greedy_accept(none), block=5)[0]
    assert ec.greedy_accept([greedy_out([1])]) is None
    assert not ec.check_accept([], None, block=5)[0]


def test_diversity_rejects_the_two_token_cycle_of_stock_dummy_weights():
    cycle = [1435, 590] * 24
    stock = [greedy_out(cycle) for _ in range(16)]
    ok, why, values = ec.check_diversity(stock)
    assert not ok and values["distinct"] == 1 and values["cycling"] == 16
    varied = [
        greedy_out([(7 * i + j * j) % 2000 for j in range(48)]) for i in range(16)
    ]
    ok, why, values = ec.check_diversity(varied)
    assert ok and values["distinct"] == 16 and values["cycling"] == 0
    assert ec.short_cycle([5, 6] * 8) and ec.short_cycle([9] * 12)
    assert not ec.short_cycle([1, 2, 3] * 8)


def test_compare_detail_says_where_prompts_differ():
    a = [greedy_out([1, 2, 3]), greedy_out([4, 5, 6])]
    b = [greedy_out([1, 2, 3]), greedy_out([4, 9, 6])]
    ok, why, values = ec.compare_detail(a, b)
    assert not ok and values["identical"] == 1 and "(1, 1)" in why
    assert ec.compare_detail(a, a)[0]
    assert not ec.compare_detail(a, a[:1])[0]
    assert not ec.compare_detail([greedy_out(None)], [greedy_out(None)])[0]


def bench_row(tput, ttft, itl, completed=64):
    return {
        "output_throughput": tput,
        "median_ttft_ms": ttft,
        "median_itl_ms": itl,
        "completed": completed,
    }


def write_rounds(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_bench_rounds_all_complete(tmp_path):
    f = write_rounds(tmp_path / "b.jsonl", [bench_row(1000, 20, 5)] * 3)
    ok, why, values = ec.check_bench(ec.bench_rounds(f), 3, 64)
    assert ok and "round 3: 1000 tok/s" in why and len(values["rounds"]) == 3
    assert not ec.check_bench(ec.bench_rounds(f), 4, 64)[0]
    f = write_rounds(tmp_path / "c.jsonl", [bench_row(1000, 20, 5, completed=60)] * 3)
    assert not ec.check_bench(ec.bench_rounds(f), 3, 64)[0]
    assert ec.bench_rounds(tmp_path / "missing.jsonl") == []


def test_ratios_per_round_and_within_the_rounds_noise(tmp_path):
    off = write_rounds(
        tmp_path / "off.jsonl",
        [bench_row(1000, 20, 5.0), bench_row(1040, 21, 4.9), bench_row(980, 19, 5.1)],
    )
    close = write_rounds(
        tmp_path / "on.jsonl",
        [bench_row(1010, 20, 5.0), bench_row(1000, 20, 5.0), bench_row(990, 20, 5.05)],
    )
    ns = SimpleNamespace(plugin=str(close), off=str(off))
    ok, why, values = ec.cmd_ratios(ns)
    assert ok and len(values["per_round"]) == 3
    assert values["per_round"][0]["output_throughput"] == 1.01
    slow = write_rounds(
        tmp_path / "slow.jsonl",
        [bench_row(700, 30, 7.0), bench_row(710, 30, 7.1), bench_row(690, 31, 7.0)],
    )
    ok, why, values = ec.cmd_ratios(SimpleNamespace(plugin=str(slow), off=str(off)))
    assert not ok and "OUTSIDE" in why
    ok, why, _ = ec.cmd_ratios(
        SimpleNamespace(plugin=str(tmp_path / "none"), off=str(off))
    )
    assert not ok


def test_server_args_one_gpu_and_dp_attention():
    one = ec.server_args(1, True, port=1, target="T", draft="D", graph_bs=8)
    assert "--enable-dp-attention" not in one and "--tp-size" not in one
    assert one[one.index("--speculative-draft-model-path") + 1] == "D"
    two = ec.server_args(2, False, port=1, target="T", draft="D", graph_bs=128)
    assert two[two.index("--dp-size") + 1] == "2" and "--enable-dp-attention" in two
    assert "--speculative-algorithm" not in two
    with pytest.raises(ValueError, match="gpus=0"):
        ec.server_args(0, True, port=1, target="T", draft="D", graph_bs=8)


def test_at_least_sixteen_distinct_prompts_inside_the_vocab():
    assert len(ec.PROMPTS) >= 16
    assert len({tuple(p) for p in ec.PROMPTS}) == len(ec.PROMPTS)
    assert ec.make_prompts() == ec.PROMPTS  # seeded: the same in every server


def test_decode_graph_on_one_gpu_counts_lines_without_a_dp_prefix(tmp_path):
    log = tmp_path / "s.log"
    log.write_text(
        "[2026 TP0] Decode batch, #running-req: 1, cuda graph: False\n"
        "[2026 TP0] Decode batch, #running-req: 1, cuda graph: True\n"
    )
    ok, why = ec.cmd_decode_graph(SimpleNamespace(log=str(log), dp=1))
    assert ok and "1 of 2" in why
    log.write_text("[2026 TP0] Decode batch, #running-req: 40, cuda graph: False\n")
    assert not ec.cmd_decode_graph(SimpleNamespace(log=str(log), dp=1))[0]


def test_report_merges_the_parts_and_keeps_values(tmp_path):
    a, b = tmp_path / "rows-dspark.json", tmp_path / "rows-nospec.json"
    ec.record(
        a, "dspark: /health", ec.SEEN, "/health 200 after 144 s", {"ready_s": 144.2}
    )
    ec.record(b, "nospec: /health", ec.FAILED, "exited")
    out, md = tmp_path / "e2e_results.json", tmp_path / "e2e_results.md"
    rc = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(out), "report", "--md", str(md),
         "--merge", str(a), str(b), "--meta", "gpus=1"],
        capture_output=True,
    )  # fmt: skip
    assert rc.returncode == 1  # one failed row
    data = json.loads(out.read_text())
    assert [r["check"] for r in data["checks"]] == [
        "dspark: /health",
        "nospec: /health",
    ]
    assert data["checks"][0]["values"] == {"ready_s": 144.2}
    assert "| nospec: /health | failed | exited |" in md.read_text()


def test_ready_seconds_of_every_part(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    ec.record(a, "dspark: /health (server ready)", ec.SEEN, "x", {"ready_s": 144.0})
    ec.record(b, "noplugin: /health (server ready)", ec.SEEN, "x", {"ready_s": 57.0})
    ec.record(
        b, "restart: /health (server ready, plugin off)", ec.SEEN, "x",
        {"ready_s": 60.0, "variant": "off"},
    )  # fmt: skip
    ok, why, values = ec.cmd_ready(SimpleNamespace(merge=[str(a), str(b)]))
    assert ok and [(s["part"], s["variant"]) for s in values["servers"]] == [
        ("dspark", "on"),
        ("noplugin", "off"),
        ("restart", "off"),
    ]
    assert why == "dspark (on) 144 s, noplugin (off) 57 s, restart (off) 60 s"
    c = tmp_path / "c.json"
    ec.record(c, "nospec: /health (server ready)", ec.FAILED, "exited")
    assert not ec.cmd_ready(SimpleNamespace(merge=[str(c)]))[0]


def _servers(**by_variant: list[float]) -> list[dict]:
    return [
        {"part": f"p{i}", "variant": v, "ready_s": x}
        for v, xs in by_variant.items()
        for i, x in enumerate(xs)
    ]


def test_ready_difference_within_the_same_variant_spread():
    """2026-12-07's start-up A/B on an H200 (warm servers; on, off,
    disabled, on, off): on 80.2 and 77.4 s, off 75.9 and 69.1 s. On - off
    is +6.3 s (medians), two off servers differ by 6.8 s: within."""
    status, why, values = ec.ready_difference(
        _servers(on=[80.2, 77.4], off=[75.9, 69.1], nospec=[60.0])
    )
    assert status == ec.SEEN and values["within"] is True
    assert values["on_minus_off_s"] == 6.3 and values["spread_s"] == 6.8
    assert "plugin on - off +6.3 s" in why and "spread 6.8 s" in why
    assert "within" in why and "60.0" not in why  # no-spec is no variant of these
    # 2026-12-07's H100 e2e (the plugin server first after a plugin-off
    # warm-up: it compiled its kernels): +27 s, with a restart pair that
    # differs as the A/B's did, is outside.
    status, why, values = ec.ready_difference(
        _servers(on=[77.0, 80.0], off=[50.0, 55.0])
    )
    assert status == ec.FAILED and "OUTSIDE" in why
    assert values["on_minus_off_s"] == 26.0 and values["spread_s"] == 5.0
    # Just outside: +6.0 s against a spread of 5.0 s.
    status, why, values = ec.ready_difference(
        _servers(on=[77.0, 80.0], off=[70.0, 75.0])
    )
    assert status == ec.FAILED and values["on_minus_off_s"] == 6.0
    assert values["spread_s"] == 5.0 and values["within"] is False
    # On the edge: within.
    status, _, values = ec.ready_difference(_servers(on=[77.0, 80.0], off=[73.5, 78.5]))
    assert status == ec.SEEN and values["on_minus_off_s"] == 2.5


def test_ready_difference_needs_a_spread_and_both_variants():
    status, why, values = ec.ready_difference(_servers(on=[77.0], off=[50.0]))
    assert status == ec.NOT_RUN and "one server per variant" in why
    assert values["on_minus_off_s"] == 27.0 and "within" not in values
    status, why, _ = ec.ready_difference(_servers(off=[50.0, 52.0]))
    assert status == ec.NOT_RUN and why == "no ready plugin on server"


def test_ready_diff_cli_records_not_run(tmp_path):
    rows, out = tmp_path / "rows.json", tmp_path / "rows-report.json"
    ec.record(
        rows, "dspark: /health (server ready)", ec.SEEN, "x",
        {"ready_s": 77.0, "variant": "on"},
    )  # fmt: skip
    ec.record(rows, "noplugin: /health (server ready)", ec.SEEN, "x", {"ready_s": 50.0})
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(out), "--check", "ready diff",
         "ready-diff", "--merge", str(rows)],
        capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0 and done.stdout.startswith("[not run] ready-diff: ")
    row = json.loads(out.read_text())["checks"][0]
    assert row["status"] == ec.NOT_RUN and row["values"]["on_minus_off_s"] == 27.0


def _report(out: Path, md: Path, *rows: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--results", str(out), "report", "--md", str(md),
         "--merge", *map(str, rows), "--meta", "gpus=1"],
        capture_output=True, text=True,
    )  # fmt: skip


def test_a_later_report_is_built_from_its_rows_files_only(tmp_path):
    """2026-12-07's calls 6 and 7 on one machine: call 6 (plugin off, then
    report) wrote the lossless rows as not run, the no-spec server not having
    run yet; call 7 (no-spec, then report) rewrote rows-report.json with the
    real lossless rows. The second report must show those, not the first
    report's rows kept in the e2e_results.json it wrote."""
    dspark, off = tmp_path / "rows-dspark.json", tmp_path / "rows-noplugin.json"
    nospec, rep = tmp_path / "rows-nospec.json", tmp_path / "rows-report.json"
    out, md = tmp_path / "e2e_results.json", tmp_path / "e2e_results.md"
    lossless = "lossless: DSpark + plugin greedy == no-spec greedy"
    ec.record(dspark, "dspark: /health (server ready)", ec.SEEN, "200 after 77 s")
    ec.record(off, "noplugin: /health (server ready)", ec.SEEN, "200 after 50 s")
    # Call 6: the report with no no-spec server yet.
    ec.record(
        rep, lossless, ec.NOT_RUN, "greedy_dspark.json or greedy_nospec.json missing"
    )
    ec.record(rep, "old row, gone from every rows file", ec.SEEN, "call 6 only")
    assert _report(out, md, dspark, off, rep).returncode == 0
    # Call 7: run_e2e.sh's report part removes and rewrites rows-report.json.
    rep.unlink()
    ec.record(nospec, "nospec: /health (server ready)", ec.SEEN, "200 after 60 s")
    ec.record(rep, lossless, ec.FAILED, "5/20 prompts identical (960 output tokens)")
    done = _report(out, md, dspark, off, nospec, rep)
    assert done.returncode == 1, done.stdout  # the lossless row failed
    rows = {r["check"]: r for r in json.loads(out.read_text())["checks"]}
    assert rows[lossless]["status"] == ec.FAILED
    assert rows[lossless]["evidence"].startswith("5/20 prompts identical")
    assert "old row, gone from every rows file" not in rows
    assert list(rows) == [
        "dspark: /health (server ready)",
        "noplugin: /health (server ready)",
        "nospec: /health (server ready)",
        lossless,
    ]
    text = md.read_text()
    assert f"| {lossless} | failed | 5/20" in text and "not run" not in text
    # Its own output given as a rows file: one line naming it, nothing written.
    done = _report(out, md, rep, out)
    assert done.returncode == 1 and f"--merge {out}" in done.stdout
    assert len(done.stdout.splitlines()) == 1 and done.stderr == ""
    assert rows == {r["check"]: r for r in json.loads(out.read_text())["checks"]}


def _plain_bind_refused(port: int) -> bool:
    """What run_e2e.sh's port check did until 2026-12-07: a bind without
    SO_REUSEADDR."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
        return False


def test_a_port_in_time_wait_is_free_for_the_server_and_a_listener_is_not(
    time_wait_port,
):
    port = time_wait_port()
    assert _plain_bind_refused(port)  # the old check called this port taken
    assert ec.port_state(port) == ec.PORT_TIME_WAIT
    ok, why, values = ec.wait_port(port, wait=5)
    assert ok and values["polls"] == 0 and "TIME_WAIT" in why
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        held = lst.getsockname()[1]
        assert ec.port_state(held) == ec.PORT_LISTENER
        ok, why, values = ec.wait_port(held, wait=0.3, poll=0.1)
        assert not ok and values["polls"] >= 1
        assert f"port {held}: taken: a listener answers after" in why
    with socket.socket() as bound:  # bound, never listening
        bound.bind(("127.0.0.1", 0))
        assert ec.port_state(bound.getsockname()[1]) == ec.PORT_NO_LISTENER
    assert ec.port_state(held) == ec.PORT_FREE
    # TIME_WAIT of a socket without SO_REUSEADDR blocks the server's bind
    # too (Linux): taken, until it closes.
    assert ec.port_state(time_wait_port(reuse=False)) == ec.PORT_NO_LISTENER


def test_the_port_check_waits_for_a_listener_that_closes():
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen()
    port = lst.getsockname()[1]
    polls = []

    def state(p: int, host: str = "127.0.0.1") -> str:
        polls.append(p)
        if len(polls) == 3:  # the stopped server's last process exits
            lst.close()
        return real(p, host)

    real = ec.port_state
    ec.port_state = state
    try:
        ok, why, values = ec.wait_port(port, wait=60, poll=0.01)
    finally:
        ec.port_state = real
        lst.close()
    assert ok and values["polls"] == 2, why
    assert values["state"] == ec.PORT_FREE and "after 2 polls" in why


def test_port_cli_exit_status_and_bad_wait(time_wait_port):
    run = [sys.executable, str(SCRIPT), "port", "--port"]
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen()
        held = str(lst.getsockname()[1])
        done = subprocess.run(
            [*run, held, "--wait", "0"], capture_output=True, text=True
        )
        assert done.returncode == 1 and "taken: a listener answers" in done.stdout
    port = str(time_wait_port())
    done = subprocess.run([*run, port, "--wait", "0"], capture_output=True, text=True)
    assert done.returncode == 0 and "TIME_WAIT" in done.stdout
    done = subprocess.run([*run, port, "--wait", "-1"], capture_output=True, text=True)
    assert done.returncode == 1 and done.stdout.strip().endswith(
        "--wait -1: seconds, at least 0"
    )


def _alarm(values: list[object], decision: str = "draft CUDA-graph capture") -> str:
    """An alarm line as the plugin's watch writes it (its own function)."""
    from sglang_dspark_dp import watch

    gathered = [
        [watch.Event(decision, 7, v, f"capture={v}", ("capture-group-memory",))]
        for v in values
    ]
    prefix = "[2026-12-07 10:00:00 DP0 TP0 EP0] "
    return prefix + watch.alarm_line((4, 5), gathered, 0)


def test_the_watchs_alarm_line_is_read_part_by_part():
    got = ec.parse_alarm(_alarm([True, False]))
    assert got["ranks"] == [4, 5]
    assert got["decision"] == "draft CUDA-graph capture"
    assert got["step"] == "step 7"
    assert got["values"] == {4: "capture=True", 5: "capture=False"}
    assert "capture-group-memory" in got["changes"] or "#" in got["changes"]
    ok, evidence, values = ec.check_alarm_format([_alarm([True, False])])
    assert ok and values == {"alarms": 1, "unreadable": 0}, evidence


def test_an_alarm_line_without_a_rank_or_a_change_is_unreadable():
    line = _alarm([True, False])
    cut = line[: line.index("; rank 5")]  # rank 5's value gone
    ok, evidence, values = ec.check_alarm_format([cut])
    assert not ok and values["unreadable"] == 1, evidence
    ok, evidence, _ = ec.check_alarm_format(["nothing of the watch here"])
    assert not ok and "no alarm line" in evidence


def test_watch_no_alarm_needs_the_watch_on_and_silent():
    watching = (
        "[2026-12-07 10:00:00 DP0 TP0 EP0] sglang-dspark-dp: watch: watching "
        "ranks [0, 1] (on a mismatch: log and end the process)"
    )
    ok, evidence, values = ec.check_watch([watching, "Decode batch"], gpus=2)
    assert ok and values["watching"] == 1, evidence
    # The watch never said it was on: two GPUs leave it unproven.
    ok, evidence, _ = ec.check_watch(["Decode batch"], gpus=2)
    assert not ok and "not on" in evidence
    # One GPU: no group to compare over, so no watching line is needed.
    ok, _, _ = ec.check_watch(["Decode batch"], gpus=1)
    assert ok
    ok, evidence, values = ec.check_watch([watching, _alarm([1, 2])], gpus=2)
    assert not ok and values["alarms"] == 1, evidence


def test_the_watching_line_is_the_watchs(caplog, monkeypatch):
    """The line the check looks for is the one the watch logs when it makes
    a group's channel (its words, read from the module's own format)."""
    from sglang_dspark_dp import watch

    text = Path(watch.__file__).read_text()
    assert "sglang-dspark-dp: watch: watching ranks %s" in text
    assert ec.WATCHING_LINE.search(
        "sglang-dspark-dp: watch: watching ranks %s" % [2, 3]
    )


def test_watch_cli_records_a_row(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(_alarm([True, False]) + "\n")
    out = tmp_path / "rows.json"
    rc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--results",
            str(out),
            "watch",
            "--log",
            str(log),
            "--gpus",
            "2",
        ],
        capture_output=True,
        text=True,
    ).returncode
    assert rc == 1
    rows = json.loads(out.read_text())
    assert "watch" in json.dumps(rows) and "failed" in json.dumps(rows)
