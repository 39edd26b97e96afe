"""CPU tests of the validation matrix: config parsing, report, and a full run
against a fake server command and a fake bench_serving command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_dspark_dp_bench.gsm8k import client, config, matrix, supervision

PY = json.dumps(sys.executable)  # a TOML-safe quoted string

FAKE_SERVER = r"""
import argparse, json, os, re, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--host")
p.add_argument("--port", type=int)
args, _ = p.parse_known_args()

# A child in the same process group, as SGLang's scheduler processes are.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
with open(os.environ["FAKE_PID_FILE"], "w") as fh:
    json.dump({"server": os.getpid(), "child": child.pid}, fh)

LOG_LOCK = threading.Lock()


def log(line):
    # One write per line under a lock: handler threads must not interleave.
    with LOG_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        log("GET " + self.path)
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/server_info":
            self._send(200, {"internal_states": [{"avg_spec_accept_length": 2.5}]})
        else:
            self._send(404, {})

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n) or b"{}")
        log("POST " + self.path)
        if self.path == "/generate":
            question = body["text"].rsplit("Question: ", 1)[1]
            number = re.findall(r"[0-9]+", question)[-1]
            self._send(200, {"text": f" #### {number}",
                             "meta_info": {"completion_tokens": 3}})
        else:
            self._send(200, {})

print("fake server listening", flush=True)
ThreadingHTTPServer((args.host, args.port), H).serve_forever()
"""

FAKE_BENCH = r"""
import argparse, json, urllib.request
p = argparse.ArgumentParser()
p.add_argument("--host")
p.add_argument("--port")
p.add_argument("--max-concurrency", type=int)
p.add_argument("--num-prompts", type=int)
p.add_argument("--output-file")
p.add_argument("--flush-cache", action="store_true")
args, rest = p.parse_known_args()
base = f"http://{args.host}:{args.port}"
if args.flush_cache:
    urllib.request.urlopen(urllib.request.Request(base + "/flush_cache", data=b""),
                           timeout=5).read()
req = urllib.request.Request(base + "/generate", data=json.dumps(
    {"text": "Question: 1\nAnswer:", "sampling_params": {}}).encode())
urllib.request.urlopen(req, timeout=5).read()
c = args.max_concurrency
with open(args.output_file, "a") as fh:
    fh.write(json.dumps({"output_throughput": 10.0 * c, "median_tpot_ms": c / 8,
                         "median_ttft_ms": 1.0, "num_prompts": args.num_prompts,
                         "accept_length": None if c == 64 else 3.0,
                         "argv_rest": rest}) + "\n")
print("fake bench done", c)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return not Path("/proc").is_dir()
    return stat[stat.rfind(")") + 2] != "Z"


def _write_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    train = [{"question": f"shot {i}", "answer": f"x\n#### {i}"} for i in range(2)]
    # The fake server answers with the last number in the question: 3 of 4 right.
    test = [
        {"question": "give 11", "answer": "#### 11"},
        {"question": "give 22", "answer": "#### 22"},
        {"question": "give 33", "answer": "#### 33"},
        {"question": "give 44", "answer": "#### 45"},
    ]
    for name, rows in (("train.jsonl", train), ("test.jsonl", test)):
        with open(folder / name, "w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    return folder


def _config(tmp_path: Path, configs: str, port: int, health_timeout: float = 15):
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    (tmp_path / "fake_bench.py").write_text(FAKE_BENCH)
    data = _write_data(tmp_path / "data")
    text = textwrap.dedent(
        f"""
        [settings]
        host = "127.0.0.1"
        port = {port}
        health_timeout_s = {health_timeout}
        stop_grace_s = 5
        bench_serving_cmd = [{PY}, {json.dumps(str(tmp_path / "fake_bench.py"))}]
        env = {{ FAKE_PID_FILE = {json.dumps(str(tmp_path / "pids.json"))} }}

        [settings.gsm8k]
        num_shots = 2
        parallel = 2
        timeout = 10
        data_path = {json.dumps(str(data))}

        [settings.bench_serving]
        concurrencies = [64, 256]
        num_prompts = 8
        warmup_requests = 1
        timeout_s = 30
        """
    )
    path = tmp_path / "matrix.toml"
    path.write_text(text + textwrap.dedent(configs))
    return path


GOOD = f"""
[[config]]
name = "good"
command = [{PY}, "fake_server.py"]
"""


def test_run_starts_uses_and_stops_servers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the good command uses a relative script path
    port = _free_port()
    cfg = _config(
        tmp_path,
        GOOD
        + f"""
        [[config]]
        name = "dies"
        command = [{PY}, "-c", "import sys; print('boom', flush=True); sys.exit(3)"]
        """,
        port,
    )
    out = tmp_path / "results"
    code = matrix.main(["run", "--config", str(cfg), "--output-dir", str(out)])
    assert code == 1  # one configuration failed

    good = json.loads((out / "good" / "result.json").read_text())
    assert good["status"] == "ok", good
    assert good["command"][-4:] == ["--host", "127.0.0.1", "--port", str(port)]
    assert good["gsm8k"]["accuracy"] == 0.75
    assert good["gsm8k"]["invalid"] == 0.0
    assert good["gsm8k"]["accept_length"] == 2.5
    assert [b["concurrency"] for b in good["bench"]] == [64, 256]
    c64, c256 = good["bench"]
    assert c64["status"] == c256["status"] == "ok"
    assert c64["result"]["output_throughput"] == 640.0
    assert c64["accept_length"] == 2.5
    assert c64["accept_length_source"] == "/server_info avg_spec_accept_length"
    assert c256["accept_length"] == 3.0
    assert c256["accept_length_source"] == "bench_serving accept_length"
    assert good["accept_length"] == 2.75
    cmd = c64["command"]
    assert cmd[:2] == [sys.executable, str(tmp_path / "fake_bench.py")]
    for flag, value in [
        ("--backend", "sglang"), ("--dataset-name", "random"),
        ("--random-input-len", "8192"), ("--random-output-len", "1024"),
        ("--max-concurrency", "64"), ("--num-prompts", "8"),
        ("--warmup-requests", "1"),
    ]:  # fmt: skip
        assert cmd[cmd.index(flag) + 1] == value
    assert "--flush-cache" in cmd
    gsm = json.loads((out / "good" / "gsm8k.json").read_text())
    assert len(gsm["records"]) == 4

    log = (out / "good" / "server.log").read_text()
    assert "GET /health" in log
    assert log.count("POST /generate") == 4 + 2  # gsm8k + one per bench case
    assert log.count("POST /flush_cache") == 2

    pids = json.loads((tmp_path / "pids.json").read_text())
    assert not _alive(pids["server"]) and not _alive(pids["child"])
    assert not supervision.port_in_use("127.0.0.1", port)

    dies = json.loads((out / "dies" / "result.json").read_text())
    assert dies["status"] == "failed"
    assert "exited with code 3" in dies["error"]
    # Its exit ended the wait, not the health deadline (15 s here).
    assert "did not answer" not in dies["error"]
    assert "boom" in dies["log_tail"]
    assert not _alive(dies["pid"])

    index = json.loads((out / "matrix.json").read_text())
    assert index["status"] == {"good": "ok", "dies": "failed"}
    report = (out / "report.md").read_text()
    assert "| good | 0.750 (1.00x) | 0.000 |" in report
    assert "| dies | n/a |" in report
    assert "exited with code 3" in report


def test_health_timeout_fails_cleanly_and_kills(tmp_path):
    port = _free_port()
    cfg = _config(
        tmp_path,
        f"""
        [[config]]
        name = "hangs"
        command = [{PY}, "-c", "import time; print('loading', flush=True); time.sleep(60)"]
        """,
        port,
        health_timeout=1.0,
    )
    out = tmp_path / "results"
    code = matrix.main(
        ["run", "--config", str(cfg), "--output-dir", str(out), "--no-report"]
    )
    assert code == 1
    res = json.loads((out / "hangs" / "result.json").read_text())
    assert res["status"] == "failed"
    assert "did not answer" in res["error"] and "/health" in res["error"]
    # The configured deadline ended the wait (the server sleeps 60 s).
    assert "within 1 s" in res["error"]
    assert "loading" in res["log_tail"]
    assert not _alive(res["pid"])
    assert not (out / "report.md").exists()


def test_interrupt_stops_server(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    port = _free_port()
    cfg = _config(tmp_path, GOOD, port)

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(client, "run", interrupted)
    out = tmp_path / "results"
    code = matrix.main(["run", "--config", str(cfg), "--output-dir", str(out)])
    assert code == 130
    res = json.loads((out / "good" / "result.json").read_text())
    assert res["status"] == "interrupted"
    pids = json.loads((tmp_path / "pids.json").read_text())
    assert not _alive(pids["server"]) and not _alive(pids["child"])


def test_dry_run_prints_commands_and_launches_nothing(tmp_path, capsys):
    port = _free_port()
    cfg = _config(tmp_path, GOOD, port)
    out = tmp_path / "results"
    code = matrix.main(
        ["run", "--config", str(cfg), "--output-dir", str(out), "--dry-run"]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "# good" in text
    assert f"fake_server.py --host 127.0.0.1 --port {port}" in text
    assert "--max-concurrency 64" in text and "--max-concurrency 256" in text
    assert "--flush-cache" in text
    assert "sglang-dspark-dp-gsm8k" in text
    assert not out.exists()
    assert not (tmp_path / "pids.json").exists()


def test_example_config_parses():
    path = Path(matrix.__file__).with_name("matrix.example.toml")
    cfg = config.load_config(path)
    names = [c.name for c in cfg.configs]
    assert names == ["target-dp-attn", "dspark-tp", "dspark-dp-attn"]
    dp = cfg.configs[2].command
    assert dp[:2] == ["sglang", "serve"]
    for flag in ["--enable-dp-attention", "--enable-dp-lm-head"]:
        assert flag in dp
    assert dp[dp.index("--speculative-algorithm") + 1] == "DSPARK"
    assert dp[dp.index("--dp") + 1] == "4"
    assert cfg.bench.concurrencies == [64, 256]
    assert cfg.bench.random_input_len == 8192
    assert cfg.bench.random_output_len == 1024
    assert cfg.bench.cmd == [sys.executable, "-m", "sglang.bench_serving"]


BASE = '[[config]]\nname = "a"\ncommand = "sglang serve"\n'


@pytest.mark.parametrize(
    "toml, field",
    [
        ("", "'config'"),
        ('[[config]]\ncommand = "x"\n', "'config[0].name'"),
        ('[[config]]\nname = "a"\n', "'config[0].command'"),
        ('[[config]]\nname = "a b"\ncommand = "x"\n', "'config[0].name'"),
        (BASE + '[[config]]\nname = "a"\ncommand = "y"\n', "'config[1].name'"),
        ('[settings]\nport = "30000"\n' + BASE, "'settings.port'"),
        ("[settings.gsm8k]\nparalel = 4\n" + BASE, "'settings.gsm8k.paralel'"),
        ("[settings.gsm8k]\napi = 'grpc'\n" + BASE, "'settings.gsm8k.api'"),
        (
            "[settings.bench_serving]\nconcurrencies = [0]\n" + BASE,
            "'settings.bench_serving.concurrencies'",
        ),
        (
            "[settings.bench_serving]\nconcurrencies = [1, 2]\nnum_prompts = [4]\n"
            + BASE,
            "'settings.bench_serving.num_prompts'",
        ),
        ("[settings]\nbench_serving_cmd = []\n" + BASE, "'settings.bench_serving_cmd'"),
    ],
)
def test_config_errors_name_the_field(tmp_path, capsys, toml, field):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(config.ConfigError) as info:
        config.load_config(path)
    assert field in str(info.value)
    code = matrix.main(["run", "--config", str(path), "--output-dir", str(tmp_path)])
    assert code == 2
    assert field in capsys.readouterr().err


@pytest.mark.parametrize(
    "toml, needle",
    [
        ('[settings]\nport = "30000"\n' + BASE, "'settings.port' must be an integer, got '30000'"),
        ("[settings]\nport = 70000\n" + BASE, "'settings.port' must be <= 65535, got 70000"),
        ("[settings.gsm8k]\nparallel = 0\n" + BASE, "'settings.gsm8k.parallel' must be >= 1, got 0"),
        ("[settings.gsm8k]\nenabled = 'yes'\n" + BASE, "'settings.gsm8k.enabled' must be true or false, got 'yes'"),
        ("[settings]\nenv = { A = true }\n" + BASE, "'settings.env.A' must be a string, got True"),
        ("[settings]\nbench_serving_cmd = []\n" + BASE, "'settings.bench_serving_cmd' must be a non-empty command (string or list of strings), got []"),
        ("settings = 3\n" + BASE, "'settings' must be a table, got 3"),
        (
            "[settings.bench_serving]\nconcurrencies = [8, 8]\n" + BASE,
            "'settings.bench_serving.concurrencies' has duplicate values, got [8, 8]",
        ),
        ('[[config]]\nname = "a b"\ncommand = "x"\n', "got 'a b'"),
        ("config = 1\n", "'config' must be a non-empty [[config]] list, got 1"),
    ],
    ids=["port-type", "port-range", "parallel", "enabled", "env", "cmd",
         "settings-table", "duplicates", "name", "config-list"],
)  # fmt: skip
def test_config_errors_name_the_value(tmp_path, toml, needle):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(config.ConfigError) as info:
        config.load_config(path)
    assert needle in str(info.value)
    assert str(path) in str(info.value)


def test_matplotlib_only_imported_to_draw(tmp_path):
    code = (
        "import sys\n"
        "from sglang_dspark_dp_bench.gsm8k import matrix, reporting\n"
        "assert 'matplotlib' not in sys.modules, 'imported too early'\n"
        "assert matrix.main(['report', '--results-dir', sys.argv[1]]) == 0\n"
        "assert 'matplotlib' in sys.modules, 'never imported'\n"
    )
    pytest.importorskip("matplotlib", reason="matplotlib not installed")
    results = _recorded_results(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", code, str(results)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (results / "report.png").is_file()


def test_invalid_toml_and_missing_file(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[settings\n")
    assert matrix.main(["run", "--config", str(bad), "--output-dir", "x"]) == 2
    assert "invalid TOML" in capsys.readouterr().err
    missing = tmp_path / "none.toml"
    assert matrix.main(["run", "--config", str(missing), "--output-dir", "x"]) == 2
    assert str(missing) in capsys.readouterr().err


def _record(results: Path, order: int, name: str, status="ok", gsm8k=None,
            bench=(), accept=None):  # fmt: skip
    folder = results / name
    folder.mkdir(parents=True)
    cases = [
        {"concurrency": c, "status": "ok",
         "result": {"output_throughput": tput, "median_tpot_ms": tpot}}
        for c, tput, tpot in bench
    ]  # fmt: skip
    data = {"name": name, "order": order, "status": status,
            "error": None if status == "ok" else "server exited with code 1",
            "gsm8k": gsm8k, "bench": cases, "accept_length": accept}  # fmt: skip
    (folder / "result.json").write_text(json.dumps(data))


def _recorded_results(tmp_path: Path) -> Path:
    results = tmp_path / "results"
    _record(results, 0, "target-dp-attn", gsm8k={"accuracy": 0.95, "invalid": 0.01},
            bench=[(64, 1000.0, 20.0), (256, 2000.0, 40.0)])  # fmt: skip
    _record(results, 1, "dspark-tp", gsm8k={"accuracy": 0.95, "invalid": 0.02},
            bench=[(64, 1500.0, 10.0), (256, 2500.0, 32.0)], accept=3.2)  # fmt: skip
    _record(results, 2, "dspark-dp-attn", status="failed")
    return results


EXPECTED_TABLE = """\
| Configuration | GSM8K accuracy | Invalid | Output tok/s c64 | Output tok/s c256 | Median TPOT ms c64 | Median TPOT ms c256 | Accept length |
|---|---:|---:|---:|---:|---:|---:|---:|
| target-dp-attn | 0.950 (1.00x) | 0.010 (1.00x) | 1000.0 (1.00x) | 2000.0 (1.00x) | 20.00 (1.00x) | 40.00 (1.00x) | n/a |
| dspark-tp | 0.950 (1.00x) | 0.020 (2.00x) | 1500.0 (1.50x) | 2500.0 (1.25x) | 10.00 (0.50x) | 32.00 (0.80x) | 3.20 |
| dspark-dp-attn | n/a | n/a | n/a | n/a | n/a | n/a | n/a |
"""


def test_report_table_ratios_and_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="matplotlib not installed")
    results = _recorded_results(tmp_path)
    assert matrix.main(["report", "--results-dir", str(results)]) == 0
    md = (results / "report.md").read_text()
    assert EXPECTED_TABLE in md
    assert "`target-dp-attn`" in md  # named as the ratio baseline
    assert "- `dspark-dp-attn`: failed: server exited with code 1" in md
    png = (results / "report.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert "Plot written to" in capsys.readouterr().out


def test_report_without_matplotlib(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import fails
    results = _recorded_results(tmp_path)
    out_md = tmp_path / "elsewhere.md"
    code = matrix.main(
        ["report", "--results-dir", str(results), "--output", str(out_md)]
    )
    assert code == 0
    assert EXPECTED_TABLE in out_md.read_text()
    assert not out_md.with_suffix(".png").exists()
    assert "matplotlib is not installed; plot skipped" in capsys.readouterr().out


def test_report_errors(tmp_path, capsys):
    assert matrix.main(["report", "--results-dir", str(tmp_path / "no")]) == 2
    assert "not found" in capsys.readouterr().err
    assert matrix.main(["report", "--results-dir", str(tmp_path)]) == 2
    assert "no */result.json" in capsys.readouterr().err
    assert matrix.main(["bogus"]) == 2
