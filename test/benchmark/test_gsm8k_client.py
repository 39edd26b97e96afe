"""CPU tests of the GSM8K client against an in-process fake SGLang server."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sglang_dspark_dp_bench.gsm8k import client

REPO_ROOT = Path(__file__).resolve().parents[2]
# The checkout's copy of the data set (tests never download it).
SHARED_GSM8K = REPO_ROOT.parent / "shared" / "data" / "gsm8k"

TRAIN = [
    {"question": "Tom has 2 apples and buys 3 more. How many?",
     "answer": "2 + 3 = <<2+3=5>>5\n#### 5"},
    {"question": "A box holds 4 pens. How many pens in 2 boxes?",
     "answer": "4 * 2 = <<4*2=8>>8\n#### 8"},
    {"question": "Sam reads 1,000 pages then 500 more. Total?",
     "answer": "1000 + 500 = <<1000+500=1500>>1500\n#### 1,500"},
]  # fmt: skip

# question -> (label as written in the data set, what the fake server does)
SCRIPT = [
    ("q-right-a: 6 birds and 1 more?", "7", "right"),
    ("q-right-b: a big sum?", "1,234", "right"),
    ("q-wrong: 3 cats and 3 dogs?", "6", "wrong"),
    ("q-unparseable: how many?", "9", "unparseable"),
    ("q-http500: some question?", "10", "http500"),
    ("q-malformed: another question?", "11", "malformed"),
    ("q-empty: yet another?", "12", "empty"),
    ("q-slow: a slow one?", "13", "slow"),
]
EXPECTED_ERRORS = {
    "http500": "http 500",
    "malformed": "malformed json",
    "empty": "empty completion",
    "slow": "timeout",
}
N = len(SCRIPT)
N_CORRECT = sum(1 for _, _, b in SCRIPT if b == "right")
N_INVALID = sum(1 for _, _, b in SCRIPT if b not in ("right", "wrong"))
CLIENT_TIMEOUT = 0.5
SLOW_SLEEP = 1.5


def _write_data(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "train.jsonl", "w") as fh:
        for row in TRAIN:
            fh.write(json.dumps(row) + "\n")
    with open(folder / "test.jsonl", "w") as fh:
        for q, label, _ in SCRIPT:
            fh.write(json.dumps({"question": q, "answer": f"work\n#### {label}"}))
            fh.write("\n")
    return folder


@pytest.fixture
def data_dir(tmp_path: Path) -> Path:
    return _write_data(tmp_path / "gsm8k")


class FakeSGLang:
    """ThreadingHTTPServer speaking SGLang's /generate and /v1/completions."""

    def __init__(self, server_info: bool = True):
        self.requests: list[tuple[str, dict]] = []
        self.server_info = server_info
        behaviours = {q: (label, b) for q, label, b in SCRIPT}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def _send(self, status: int, body: bytes, ctype="application/json"):
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/server_info" and owner.server_info:
                    self._send(200, json.dumps({"version": "fake-0"}).encode())
                elif self.path == "/v1/models":
                    self._send(
                        200, json.dumps({"data": [{"id": "fake-model"}]}).encode()
                    )
                else:
                    self._send(404, b'{"detail": "not found"}')

            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length))
                owner.requests.append((self.path, body))
                if self.path == "/generate":
                    prompt = body["text"]
                elif self.path == "/v1/completions":
                    prompt = body["prompt"]
                else:
                    self._send(404, b"{}")
                    return
                question = prompt.rsplit("Question: ", 1)[1].split("\nAnswer:")[0]
                label, behaviour = behaviours[question]
                value = int(label.replace(",", ""))
                if behaviour == "http500":
                    self._send(500, b'{"error": "boom"}')
                    return
                if behaviour == "malformed":
                    self._send(200, b'{"text": "The answer is 11')
                    return
                if behaviour == "slow":
                    time.sleep(SLOW_SLEEP)
                text = {
                    "right": f" Reasoning.\nThe answer is {value:,}.\n#### {value:,}",
                    "wrong": f" Guessing.\n#### {value + 1}",
                    "unparseable": " I cannot tell.",
                    "empty": "",
                    "slow": f" #### {value}",
                }[behaviour]
                tokens = len(text.split())
                if self.path == "/generate":
                    payload = {
                        "text": text,
                        "meta_info": {"completion_tokens": tokens, "id": "x"},
                    }
                else:
                    payload = {
                        "choices": [{"index": 0, "text": text}],
                        "usage": {"completion_tokens": tokens},
                    }
                self._send(200, json.dumps(payload).encode())

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        # A slow answer whose client timed out meets a closed socket; the
        # traceback socketserver prints would land in a later test's stderr.
        self.httpd.handle_error = lambda request, client_address: None
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(port: int, data: Path | None, result: Path, *extra: str) -> list[str]:
    """Client flags; ``data=None`` leaves out --data-path (the cache is used)."""
    return [
        "--port", str(port), "--result-file", str(result),
        *(["--data-path", str(data)] if data is not None else []),
        "--num-shots", "3", "--parallel", "4", "--timeout", str(CLIENT_TIMEOUT),
        "--max-new-tokens", "64", *extra,
    ]  # fmt: skip


# SGLang's four lines, then the failed requests (grouped by reason when any).
LINE_FORMAT = re.compile(
    r"\AAccuracy: \d\.\d{3}\nInvalid: \d\.\d{3}\nLatency: \d+\.\d{3} s\n"
    r"Output throughput: \d+\.\d{3} token/s\n"
    r"Failed requests: \d+ of \d+(\n|, by reason:\n(  +\d+  [^\n]+\n)+)\Z"
)


@pytest.mark.parametrize("api", ["generate", "openai"])
def test_scripted_accuracy_invalid_and_records(api, data_dir, tmp_path, capsys):
    result_file = tmp_path / "out" / "res.json"
    with FakeSGLang() as fake:
        code = client.main(_argv(fake.port, data_dir, result_file, "--api", api))
    out = capsys.readouterr().out
    assert code == 0
    assert LINE_FORMAT.match(out), out
    assert out.splitlines()[0] == f"Accuracy: {N_CORRECT / N:.3f}" == "Accuracy: 0.250"
    assert out.splitlines()[1] == f"Invalid: {N_INVALID / N:.3f}" == "Invalid: 0.625"
    assert out.splitlines()[4:] == [
        f"Failed requests: {len(EXPECTED_ERRORS)} of {N}, by reason:",
        "  1  empty completion",
        "  1  http 500",
        "  1  malformed json",
        "  1  timeout",
    ]

    res = json.loads(result_file.read_text())
    assert res["interrupted"] is False
    assert res["summary"]["accuracy"] == N_CORRECT / N
    assert res["summary"]["invalid"] == N_INVALID / N
    assert res["summary"]["num_errors"] == len(EXPECTED_ERRORS)
    assert res["summary"]["errors"] == {v: 1 for v in EXPECTED_ERRORS.values()}
    assert res["server_info"] == {"version": "fake-0"}
    assert res["server_info_error"] is None
    assert res["config"]["api"] == api
    records = res["records"]
    assert [r["index"] for r in records] == list(range(N))
    for rec, (q, label, behaviour) in zip(records, SCRIPT, strict=False):
        assert rec["question"] == q
        assert rec["label"] == int(label.replace(",", ""))
        assert rec["error"] == EXPECTED_ERRORS.get(behaviour), rec
        assert rec["correct"] is (behaviour == "right")
        assert isinstance(rec["latency"], float)
        if behaviour in EXPECTED_ERRORS or behaviour == "unparseable":
            assert rec["prediction"] == client.INVALID
        if behaviour == "wrong":
            assert rec["prediction"] == rec["label"] + 1
        if behaviour == "right":
            assert rec["completion_tokens"] > 0
    # The slow answer: the client gave up at its own timeout (an error, no
    # prediction) instead of waiting for the server; no wall-clock bound.
    slow = records[7]
    assert (slow["error"], slow["prediction"]) == ("timeout", client.INVALID)

    # What went over the wire: SGLang's request formats, greedy, stop strings.
    path = "/generate" if api == "generate" else "/v1/completions"
    sent = [b for p, b in fake.requests if p == path]
    assert len(sent) == N
    for body in sent:
        if api == "generate":
            prompt = body["text"]
            sp = body["sampling_params"]
            assert sp == {
                "max_new_tokens": 64,
                "temperature": 0.0,
                "stop": ["Question", "Assistant:", "<|separator|>"],
            }
        else:
            prompt = body["prompt"]
            assert body["model"] == "fake-model"
            assert body["max_tokens"] == 64 and body["temperature"] == 0.0
            assert body["stop"] == ["Question", "Assistant:", "<|separator|>"]
        shots = "".join(
            f"Question: {r['question']}\nAnswer: {r['answer']}\n\n" for r in TRAIN
        )
        assert prompt.startswith(shots)
        question = prompt[len(shots) :]
        assert re.fullmatch(r"Question: q-[^\n]+\nAnswer:", question)


def test_missing_server_info_is_recorded_not_fatal(data_dir, tmp_path, capsys):
    result_file = tmp_path / "res.json"
    with FakeSGLang(server_info=False) as fake:
        code = client.main(
            _argv(fake.port, data_dir, result_file, "--num-questions", "2")
        )
    assert code == 0
    res = json.loads(result_file.read_text())
    assert res["server_info"] is None
    assert "http 404" in res["server_info_error"]
    assert len(res["records"]) == 2
    assert capsys.readouterr().out.startswith("Accuracy: 1.000\nInvalid: 0.000\n")


def test_unreachable_server_exit_2(data_dir, tmp_path, capsys):
    port = _free_port()
    code = client.main(_argv(port, data_dir, tmp_path / "r.json"))
    err = capsys.readouterr().err
    assert code == 2
    assert f"http://127.0.0.1:{port}/health" in err
    assert "cannot reach" in err
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize(
    "flags, needle",
    [
        (["--num-questions", "0"], "--num-questions must be >= 1, got 0"),
        (["--num-questions", "-3"], "--num-questions must be >= 1, got -3"),
        (["--parallel", "0"], "--parallel must be >= 1, got 0"),
        (["--parallel", "two"], "--parallel must be an integer, got 'two'"),
        (["--num-shots", "4"], "argument --num-shots: 4 is more than the 3"),
        (["--api", "grpc"], "argument --api: invalid choice: 'grpc'"),
    ],
)
def test_bad_flags_exit_2(flags, needle, data_dir, tmp_path, capsys):
    port = _free_port()  # never contacted: validation comes first
    argv = _argv(port, data_dir, tmp_path / "r.json")
    # later flags override the defaults in _argv
    code = client.main(argv + flags)
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err, err


def test_missing_data_file_exit_2(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    code = client.main(["--data-path", str(missing), "--port", str(_free_port())])
    err = capsys.readouterr().err
    assert code == 2
    assert str(missing / "train.jsonl") in err
    assert "not found" in err


def test_keyboard_interrupt_saves_partial_results(
    data_dir, tmp_path, capsys, monkeypatch
):
    original = client.Backend.complete

    def complete(self, prompt):
        if "q-wrong" in prompt.rsplit("Question: ", 1)[1]:
            raise KeyboardInterrupt
        return original(self, prompt)

    monkeypatch.setattr(client.Backend, "complete", complete)
    result_file = tmp_path / "res.json"
    with FakeSGLang() as fake:
        code = client.main(_argv(fake.port, data_dir, result_file, "--parallel", "1"))
    captured = capsys.readouterr()
    assert code == 130
    assert "interrupted" in captured.err
    res = json.loads(result_file.read_text())
    assert res["interrupted"] is True
    indices = [r["index"] for r in res["records"]]
    assert indices[:2] == [0, 1]
    assert 2 not in indices
    assert len(indices) < N
    assert res["num_questions_requested"] == N


def test_extraction_and_labels():
    assert client.extract_number("so 1,234 in total") == 1234
    assert client.extract_number("first 3 then 41.") == 41
    assert client.extract_number("3.5") == 5
    assert client.extract_number("-3") == 3
    assert client.extract_number("no digits here") == client.INVALID
    assert client.extract_number("") == client.INVALID
    assert client.extract_number("007") == client.INVALID
    assert client.extract_number("0") == 0
    assert client.answer_label("a 2 b 3\n#### 1,500") == 1500
    assert client.answer_label("#### -3") == 3
    assert client.answer_label("no marker 42") == 42


def test_script_entry_point_help():
    proc = subprocess.run(
        [sys.executable, str(REPO_ROOT / "benchmark/gsm8k/client.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 0
    assert "--num-questions" in proc.stdout


def test_real_gsm8k_files_and_prompt():
    train_path, test_path = client.resolve_data_files(SHARED_GSM8K)
    if not (train_path.is_file() and test_path.is_file()):
        pytest.skip(f"GSM8K data not present at {train_path.parent}")
    train = client.load_jsonl(train_path)
    test = client.load_jsonl(test_path)
    assert len(test) == 1319
    assert len(train) >= 5
    labels = [client.answer_label(r["answer"]) for r in test]
    assert client.INVALID not in labels
    prompts = client.build_prompts(train, test, 5)
    assert len(prompts) == 1319
    first = prompts[0]
    assert first.count("Question: ") == 6
    assert first.startswith(f"Question: {train[0]['question']}\nAnswer: ")
    assert f"\nAnswer: {train[4]['answer']}\n\n" in first
    assert first.endswith(f"\n\nQuestion: {test[0]['question']}\nAnswer:")
    prefix = client.build_few_shot_prefix(train, 5)
    assert all(p.startswith(prefix) for p in prompts)


def test_console_summary_groups_failures_by_reason():
    summary = {
        "accuracy": 0.5, "invalid": 0.25, "latency": 2.0, "output_throughput": 10.0,
        "num_questions": 20, "num_errors": 7,
        "errors": {"timeout": 1, "http 500": 3, "connection error: reset": 3},
    }  # fmt: skip
    assert client.format_summary(summary).splitlines()[4:] == [
        "Failed requests: 7 of 20, by reason:",
        "  3  connection error: reset",
        "  3  http 500",
        "  1  timeout",
    ]
    clean = {**summary, "num_errors": 0, "errors": {}}
    assert client.format_summary(clean).splitlines()[4:] == ["Failed requests: 0 of 20"]


def test_console_summary_counts_repeated_failures(data_dir, tmp_path, capsys):
    # No server at all behind /generate: every request fails the same way.
    result_file = tmp_path / "res.json"
    with FakeSGLang() as fake:
        fake_port = fake.port
        original = client.Backend.complete

        def complete(self, prompt):
            if "q-right" in prompt.rsplit("Question: ", 1)[1]:
                return original(self, prompt)
            raise client.RequestFailed("http 503")

        client.Backend.complete = complete
        try:
            code = client.main(_argv(fake_port, data_dir, result_file))
        finally:
            client.Backend.complete = original
    out = capsys.readouterr().out
    assert code == 0
    assert LINE_FORMAT.match(out), out
    assert out.splitlines()[4:] == [
        f"Failed requests: {N - 2} of {N}, by reason:",
        f"  {N - 2}  http 503",
    ]


def test_data_from_the_cache_without_download(gsm8k_cache, data_dir, tmp_path, capsys):
    _write_data(gsm8k_cache)
    assert client.default_cache_dir() == gsm8k_cache
    assert client.resolve_data_files(None) == (
        gsm8k_cache / "train.jsonl",
        gsm8k_cache / "test.jsonl",
    )
    result_file = tmp_path / "res.json"
    with FakeSGLang() as fake:
        code = client.main(_argv(fake.port, None, result_file))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "download" not in captured.err
    assert len(json.loads(result_file.read_text())["records"]) == N

    # An explicit path is used as given: no fallback to the (full) cache.
    missing = tmp_path / "nowhere"
    code = client.main(_argv(_free_port(), missing, result_file))
    err = capsys.readouterr().err
    assert code == 2
    assert f"{missing / 'train.jsonl'}" in err and "--data-path" in err


def test_cache_root_defaults_to_home(monkeypatch, tmp_path):
    monkeypatch.delenv(client.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert client.default_cache_dir() == tmp_path / ".cache/sglang-dspark-dp/gsm8k"


def test_offline_download_is_one_line(gsm8k_cache, unreachable_url, tmp_path, capsys):
    code = client.main(_argv(_free_port(), None, tmp_path / "r.json"))
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    line = lines[0]
    prefix = (
        "sglang-dspark-dp-gsm8k: error: cannot download GSM8K test.jsonl from "
        f"{unreachable_url}test.jsonl ("
    )
    assert line.startswith(prefix), line
    assert "refused" in line.lower(), line
    assert line.endswith(
        "; pass --data-path DIR holding test.jsonl and train.jsonl, "
        f"or put them in {gsm8k_cache}"
    ), line
    assert list(gsm8k_cache.iterdir()) == []  # no partial file left behind
    assert not (tmp_path / "r.json").exists()


class _FileServer:
    """Serves ``files`` (name -> bytes or a callable writing the response)."""

    def __init__(self, files: dict):
        self.requests: list[str] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                owner.requests.append(self.path)
                name = self.path.rsplit("/", 1)[-1]
                body = files.get(name) if self.path.startswith("/gsm8k/") else None
                if body is None:
                    self.send_error(404)
                    return
                if callable(body):
                    body(self)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/gsm8k/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


def _jsonl(rows) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def test_download_fills_the_cache_once(gsm8k_cache, monkeypatch, tmp_path, capsys):
    test_rows = [{"question": q, "answer": f"#### {label}"} for q, label, _ in SCRIPT]
    files = {"train.jsonl": _jsonl(TRAIN), "test.jsonl": _jsonl(test_rows)}
    with _FileServer(files) as server:
        monkeypatch.setattr(client, "GSM8K_URL_BASE", server.url)
        result_file = tmp_path / "res.json"
        with FakeSGLang() as fake:
            code = client.main(_argv(fake.port, None, result_file))
        captured = capsys.readouterr()
        assert code == 0, captured.err
        assert sorted(server.requests) == ["/gsm8k/test.jsonl", "/gsm8k/train.jsonl"]
        assert sorted(p.name for p in gsm8k_cache.iterdir()) == sorted(files)
        for name, body in files.items():
            assert (gsm8k_cache / name).read_bytes() == body
        assert "downloaded GSM8K test.jsonl" in captured.err
        assert len(json.loads(result_file.read_text())["records"]) == N
        # Second run: served from the cache.
        assert client.resolve_data_files(None)[1] == gsm8k_cache / "test.jsonl"
        assert len(server.requests) == 2


def test_zero_shot_downloads_only_the_test_file(gsm8k_cache, monkeypatch):
    files = {"test.jsonl": _jsonl([{"question": "q", "answer": "#### 1"}])}
    with _FileServer(files) as server:
        monkeypatch.setattr(client, "GSM8K_URL_BASE", server.url)
        client.resolve_data_files(None, need_train=False)
    assert server.requests == ["/gsm8k/test.jsonl"]
    assert [p.name for p in gsm8k_cache.iterdir()] == ["test.jsonl"]


def _truncated(handler):
    handler.send_response(200)
    handler.send_header("Content-Length", "100000")
    handler.end_headers()
    handler.wfile.write(_jsonl(TRAIN))  # then the connection closes early
    handler.wfile.flush()
    handler.close_connection = True


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"<html>Sign in to this network</html>\n", "is not GSM8K JSONL"),
        (_truncated, "cannot download GSM8K test.jsonl"),
        (None, "HTTP 404"),
    ],
    ids=["not-jsonl", "truncated", "missing"],
)
def test_bad_download_leaves_the_cache_empty(
    gsm8k_cache, monkeypatch, capsys, body, needle
):
    files = {"test.jsonl": body} if body is not None else {}
    with _FileServer(files) as server:
        monkeypatch.setattr(client, "GSM8K_URL_BASE", server.url)
        code = client.main(["--port", str(_free_port()), "--num-shots", "0"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.splitlines()) == 1, err
    assert needle in err, err
    assert "--data-path DIR" in err
    assert list(gsm8k_cache.iterdir()) == []
