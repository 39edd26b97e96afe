"""GSM8K k-shot accuracy client for a running SGLang server.

The prompt layout, stop strings and scoring follow the few-shot GSM8K check
that SGLang's own test-suite uses, so the figures are comparable with it:

* every shot and the question are laid out as ``Question: <q>\\nAnswer:`` (the
  shots followed by their worked answer and a blank line);
* generation stops at the start of the next ``Question`` (or an assistant /
  separator marker);
* the reference value is the number after ``#### `` in the data set, and the
  prediction is the last run of digits in the completion once thousands
  separators are dropped; a completion without one is *invalid*.

The data set is looked up like SGLang's own few-shot GSM8K benchmark does: a
folder given with ``--data-path``; else the cache folder
(``$SGLANG_DSPARK_DP_CACHE/gsm8k``, default ``~/.cache/sglang-dspark-dp/gsm8k``);
else ``test.jsonl`` / ``train.jsonl`` are downloaded from the GSM8K repository
into that cache.

Only the standard library is needed (``tqdm`` is used for the progress bar when
it happens to be installed). Usage::

    sglang-dspark-dp-gsm8k --port 30000 --num-questions 200 --parallel 64
    python -m sglang_dspark_dp_bench.gsm8k.client --api openai --base-url http://host:30000
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import socket
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

# Prediction value used when no number can be read from a completion (or the
# request failed). It can never equal a label, which are all >= 0.
INVALID = -9999999

STOP_STRINGS = ["Question", "Assistant:", "<|separator|>"]

DEFAULT_RESULT_FILE = "gsm8k_result.json"

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

_DIGITS = re.compile(r"[0-9]+")

#: Where the canonical GSM8K files are downloaded from (``<base><name>``).
GSM8K_URL_BASE = (
    "https://raw.githubusercontent.com/openai/grade-school-math/master/"
    "grade_school_math/data/"
)
TRAIN_FILE = "train.jsonl"
TEST_FILE = "test.jsonl"
#: Environment variable naming the cache root (the data goes in ``<root>/gsm8k``).
CACHE_ENV = "SGLANG_DSPARK_DP_CACHE"
DOWNLOAD_TIMEOUT = 60.0


def default_cache_dir() -> Path:
    """``$SGLANG_DSPARK_DP_CACHE/gsm8k``, else ``~/.cache/sglang-dspark-dp/gsm8k``."""
    root = os.environ.get(CACHE_ENV)
    base = (
        Path(root).expanduser() if root else Path.home() / ".cache" / "sglang-dspark-dp"
    )
    return base / "gsm8k"


# --------------------------------------------------------------------------
# Data set, prompts and scoring
# --------------------------------------------------------------------------


class DataError(Exception):
    """A data file is missing or unreadable."""


class DownloadError(DataError):
    """A data file is not cached and could not be downloaded."""


def load_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise DataError(f"GSM8K data file not found: {path}")
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
            if (
                not isinstance(row, dict)
                or "question" not in row
                or "answer" not in row
            ):
                raise DataError(f"{path}:{lineno}: needs 'question' and 'answer' keys")
            rows.append(row)
    return rows


def _one_line(exc: BaseException) -> str:
    """A short, single-line description of a download failure."""
    if isinstance(exc, urllib.error.HTTPError):
        text = f"HTTP {exc.code} {exc.reason}"
    elif isinstance(exc, urllib.error.URLError):
        text = str(exc.reason)
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())


def _download_hint(cache_dir: Path) -> str:
    return (
        f"pass --data-path DIR holding {TEST_FILE} and {TRAIN_FILE}, "
        f"or put them in {cache_dir}"
    )


def download_file(name: str, cache_dir: Path) -> Path:
    """Download ``GSM8K_URL_BASE + name`` into ``cache_dir`` (atomically).

    The file is written to a temporary name in ``cache_dir``, checked to be
    GSM8K JSONL, then renamed into place, so the cache never holds a partial
    or foreign file. Raises :class:`DownloadError` with a one-line message.
    """
    url = GSM8K_URL_BASE + name
    dest = cache_dir / name
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(
            dir=cache_dir, prefix=f".{name}.", suffix=".part"
        )
    except OSError as exc:
        raise DownloadError(
            f"cannot create the GSM8K cache folder {cache_dir} ({_one_line(exc)}); "
            f"pass --data-path DIR holding {TEST_FILE} and {TRAIN_FILE}, "
            f"or set ${CACHE_ENV} to a writable folder"
        ) from None
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as fh:
                with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as resp:
                    expected = resp.headers.get("Content-Length")
                    size = 0
                    while chunk := resp.read(1 << 16):
                        fh.write(chunk)
                        size += len(chunk)
            # http.client does not flag a body cut short when read in chunks.
            if expected is not None and expected.isdigit() and size < int(expected):
                raise http.client.IncompleteRead(b"", int(expected) - size)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise DownloadError(
                f"cannot download GSM8K {name} from {url} ({_one_line(exc)}); "
                + _download_hint(cache_dir)
            ) from None
        try:
            load_jsonl(tmp)
        except DataError as exc:
            problem = str(exc).replace(str(tmp), name)
            raise DownloadError(
                f"the GSM8K {name} downloaded from {url} is not GSM8K JSONL "
                f"({problem}); " + _download_hint(cache_dir)
            ) from None
        tmp.chmod(0o644)  # mkstemp made it private; the cache is shareable
        os.replace(tmp, dest)
        print(f"downloaded GSM8K {name} from {url} to {dest}", file=sys.stderr)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def resolve_data_files(
    data_path: str | os.PathLike | None, *, need_train: bool = True
) -> tuple[Path, Path]:
    """Return ``(train.jsonl, test.jsonl)``.

    ``data_path`` given: that folder (a path to a file is taken as the test
    file, with ``train.jsonl`` beside it); nothing is downloaded, and missing
    files are reported by :func:`load_jsonl`. Not given: the cache folder
    (:func:`default_cache_dir`), downloading the files it lacks (``train.jsonl``
    only when ``need_train``).
    """
    if data_path:
        base = Path(data_path).expanduser()
        if base.is_file():
            return base.parent / TRAIN_FILE, base
        return base / TRAIN_FILE, base / TEST_FILE
    cache_dir = default_cache_dir()
    train, test = cache_dir / TRAIN_FILE, cache_dir / TEST_FILE
    for path in (test, train) if need_train else (test,):
        if not path.is_file():
            download_file(path.name, cache_dir)
    return train, test


def extract_number(text: str) -> int:
    """Last integer written in ``text`` (commas ignored), or :data:`INVALID`.

    Signs and decimal points are not part of a match, exactly like the scoring
    in SGLang's GSM8K check; a match with a leading zero (``"007"``) is not a
    valid integer literal there either, so it is invalid here too.
    """
    found = _DIGITS.findall(text.replace(",", ""))
    if not found:
        return INVALID
    last = found[-1]
    if len(last) > 1 and last[0] == "0":
        return INVALID
    return int(last)


def answer_label(answer: str) -> int:
    """The reference value of a data-set answer: the number after ``####``."""
    _, sep, tail = answer.rpartition("####")
    return extract_number(tail if sep else answer)


def format_question(question: str) -> str:
    return f"Question: {question}\nAnswer:"


def build_few_shot_prefix(train_rows: list[dict[str, Any]], num_shots: int) -> str:
    shots = [
        f"{format_question(row['question'])} {row['answer']}\n\n"
        for row in train_rows[:num_shots]
    ]
    return "".join(shots)


def build_prompts(
    train_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
    num_shots: int,
) -> list[str]:
    prefix = build_few_shot_prefix(train_rows, num_shots)
    return [prefix + format_question(row["question"]) for row in test_rows]


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


class RequestFailed(Exception):
    """A request did not yield a usable completion; ``reason`` is recorded."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _is_timeout(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | socket.timeout):
        return True
    reason = getattr(exc, "reason", None)
    return isinstance(reason, TimeoutError | socket.timeout)


def http_request(
    url: str,
    payload: dict[str, Any] | None = None,
    timeout: float = 30.0,
    api_key: str | None = None,
    method: str | None = None,
) -> tuple[int, bytes]:
    """Send a request; return ``(status, body)``. Raise :class:`RequestFailed`."""
    data = None if payload is None else json.dumps(payload).encode("utf-8")
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        raise RequestFailed(f"http {exc.code}") from exc
    except urllib.error.URLError as exc:
        if _is_timeout(exc):
            raise RequestFailed("timeout") from exc
        raise RequestFailed(f"connection error: {exc.reason}") from exc
    except TimeoutError as exc:
        raise RequestFailed("timeout") from exc
    except (ConnectionError, OSError) as exc:
        # The connection dropped mid-response, or an http.client protocol error.
        raise RequestFailed(f"connection error: {exc}") from exc
    except Exception as exc:  # http.client.IncompleteRead, BadStatusLine, ...
        raise RequestFailed(f"connection error: {type(exc).__name__}: {exc}") from exc


def get_json(url: str, timeout: float, api_key: str | None = None) -> Any:
    _, body = http_request(url, timeout=timeout, api_key=api_key)
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestFailed("malformed json") from exc


def _decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestFailed("malformed json") from exc


class Backend:
    """Sends one prompt to the server and returns ``(text, completion_tokens)``."""

    def __init__(self, args: argparse.Namespace):
        self.base_url = args.base_url
        self.api = args.api
        self.timeout = args.timeout
        self.api_key = args.api_key
        self.max_new_tokens = args.max_new_tokens
        self.temperature = args.temperature
        self.model = args.model

    def complete(self, prompt: str) -> tuple[str, int]:
        if self.api == "openai":
            return self._complete_openai(prompt)
        return self._complete_generate(prompt)

    def _complete_generate(self, prompt: str) -> tuple[str, int]:
        payload = {
            "text": prompt,
            "sampling_params": {
                "max_new_tokens": self.max_new_tokens,
                "temperature": self.temperature,
                "stop": STOP_STRINGS,
            },
        }
        _, body = http_request(
            f"{self.base_url}/generate", payload, self.timeout, self.api_key
        )
        data = _decode(body)
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        if not isinstance(data, dict) or not isinstance(data.get("text"), str):
            raise RequestFailed("unexpected response")
        meta = data.get("meta_info") or {}
        tokens = meta.get("completion_tokens", 0) if isinstance(meta, dict) else 0
        return data["text"], _as_int(tokens)

    def _complete_openai(self, prompt: str) -> tuple[str, int]:
        payload = {
            "model": self.model or "default",
            "prompt": prompt,
            "max_tokens": self.max_new_tokens,
            "temperature": self.temperature,
            "stop": STOP_STRINGS,
        }
        _, body = http_request(
            f"{self.base_url}/v1/completions", payload, self.timeout, self.api_key
        )
        data = _decode(body)
        try:
            text = data["choices"][0]["text"]
        except (KeyError, IndexError, TypeError) as exc:
            raise RequestFailed("unexpected response") from exc
        if not isinstance(text, str):
            raise RequestFailed("unexpected response")
        usage = data.get("usage") or {}
        tokens = usage.get("completion_tokens", 0) if isinstance(usage, dict) else 0
        return text, _as_int(tokens)


def _as_int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def probe_server(args: argparse.Namespace) -> str | None:
    """Return None when the server answers, else a message naming the URL."""
    timeout = min(args.timeout, 10.0)
    health = f"{args.base_url}/health"
    try:
        http_request(health, timeout=timeout, api_key=args.api_key)
        return None
    except RequestFailed as exc:
        first = exc.reason
    if first.startswith("http "):
        # Something is listening; some deployments do not expose /health.
        for path in ("/server_info", "/get_server_info"):
            try:
                http_request(
                    f"{args.base_url}{path}", timeout=timeout, api_key=args.api_key
                )
                return None
            except RequestFailed:
                pass
    return f"cannot reach the SGLang server at {health} ({first})"


def fetch_server_info(
    base_url: str, timeout: float, api_key: str | None = None
) -> tuple[Any, str | None]:
    """``(info, None)`` from the server-info endpoint, or ``(None, error)``."""
    errors = []
    for path in ("/server_info", "/get_server_info"):
        try:
            return get_json(f"{base_url}{path}", timeout, api_key), None
        except RequestFailed as exc:
            errors.append(f"{path}: {exc.reason}")
    return None, "; ".join(errors)


def pick_model_name(args: argparse.Namespace) -> str:
    if args.model:
        return args.model
    try:
        data = get_json(f"{args.base_url}/v1/models", min(args.timeout, 10.0))
        return str(data["data"][0]["id"])
    except (RequestFailed, KeyError, IndexError, TypeError):
        return "default"


# --------------------------------------------------------------------------
# Progress display
# --------------------------------------------------------------------------


class _Counter:
    """Minimal stderr progress counter used when tqdm is not installed."""

    def __init__(self, total: int):
        self.total = total
        self.done = 0
        self._last = 0.0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.monotonic()
        if self.done == self.total or now - self._last >= 0.5:
            self._last = now
            sys.stderr.write(f"\rgsm8k: {self.done}/{self.total}")
            sys.stderr.flush()

    def close(self) -> None:
        if self.total:
            sys.stderr.write("\n")
            sys.stderr.flush()


class _Silent:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def make_progress(total: int, enabled: bool):
    if not enabled:
        return _Silent()
    try:
        from tqdm import tqdm
    except ImportError:
        return _Counter(total)
    return tqdm(total=total, desc="gsm8k", file=sys.stderr)


# --------------------------------------------------------------------------
# Argument handling
# --------------------------------------------------------------------------


def _number(flag: str, kind: type, *, minimum: float, strict: bool):
    """argparse type: a ``kind`` number above (``strict``) or at ``minimum``."""
    noun = "an integer" if kind is int else "a number"
    bound = f"> {minimum}" if strict else f">= {minimum}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(
                f"{flag} must be {noun}, got {text!r}"
            ) from exc
        if not (value > minimum if strict else value >= minimum):
            raise argparse.ArgumentTypeError(f"{flag} must be {bound}, got {text}")
        return value

    return parse


def _positive_int(flag: str):
    return _number(flag, int, minimum=1, strict=False)


def _non_negative_int(flag: str):
    return _number(flag, int, minimum=0, strict=False)


def _positive_float(flag: str):
    return _number(flag, float, minimum=0, strict=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang-dspark-dp-gsm8k",
        description="GSM8K k-shot accuracy of a running SGLang server.",
    )
    p.add_argument(
        "--api",
        choices=["generate", "openai"],
        default="generate",
        help="native /generate (default) or OpenAI /v1/completions",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_positive_int("--port"), default=30000)
    p.add_argument(
        "--base-url",
        default=None,
        help="server URL, e.g. http://10.0.0.1:30000 (overrides " "--host/--port)",
    )
    p.add_argument(
        "--model",
        default=None,
        help="model name for --api openai (default: first entry of " "/v1/models)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("SGLANG_API_KEY"),
        help="bearer token (default: $SGLANG_API_KEY)",
    )
    p.add_argument(
        "--data-path",
        "--data-dir",
        dest="data_path",
        default=None,
        help="folder holding train.jsonl and test.jsonl, or the test file "
        f"itself (default: the cache folder, ${CACHE_ENV}/gsm8k or "
        "~/.cache/sglang-dspark-dp/gsm8k, downloading what it lacks)",
    )
    p.add_argument("--num-shots", type=_non_negative_int("--num-shots"), default=5)
    p.add_argument(
        "--num-questions",
        type=_positive_int("--num-questions"),
        default=None,
        help="first N test questions (default: all)",
    )
    p.add_argument(
        "--parallel",
        type=_positive_int("--parallel"),
        default=64,
        help="requests in flight",
    )
    p.add_argument(
        "--max-new-tokens", type=_positive_int("--max-new-tokens"), default=512
    )
    p.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="sampling temperature (default 0: greedy)",
    )
    p.add_argument(
        "--timeout",
        type=_positive_float("--timeout"),
        default=600.0,
        help="seconds per request",
    )
    p.add_argument(
        "--result-file",
        default=DEFAULT_RESULT_FILE,
        help="JSON result file (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and normalise the flags (``SystemExit(2)`` on bad input)."""
    args = build_parser().parse_args(argv)
    if args.base_url:
        args.base_url = args.base_url.rstrip("/")
        if "://" not in args.base_url:
            args.base_url = f"http://{args.base_url}"
    else:
        args.base_url = f"http://{args.host}:{args.port}"
    return args


def load_questions(
    args: argparse.Namespace,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Load the data files; raise :class:`DataError` or ``SystemExit(2)``."""
    train_path, test_path = resolve_data_files(
        args.data_path, need_train=args.num_shots > 0
    )
    try:
        train_rows = load_jsonl(train_path) if args.num_shots > 0 else []
        test_rows = load_jsonl(test_path)
    except DataError as exc:
        if args.data_path and not isinstance(exc, DownloadError):
            raise DataError(
                f"{exc} (--data-path {args.data_path} must hold {TRAIN_FILE} "
                f"and {TEST_FILE})"
            ) from None
        raise
    if args.num_shots > len(train_rows):
        build_parser().error(
            f"argument --num-shots: {args.num_shots} is more than the "
            f"{len(train_rows)} examples in {train_path}"
        )
    if args.num_questions is not None:
        test_rows = test_rows[: args.num_questions]
    if not test_rows:
        raise DataError(f"no questions in {test_path}")
    return train_rows, test_rows


# --------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------


def _one_question(
    backend: Backend, index: int, row: dict[str, Any], prompt: str
) -> dict[str, Any]:
    label = answer_label(row["answer"])
    started = time.perf_counter()
    text: str | None = None
    tokens = 0
    error: str | None = None
    try:
        text, tokens = backend.complete(prompt)
        if not text.strip():
            error = "empty completion"
    except RequestFailed as exc:
        error = exc.reason
    latency = time.perf_counter() - started
    prediction = INVALID if error is not None else extract_number(text or "")
    return {
        "index": index,
        "question": row["question"],
        "label": label,
        "completion": text,
        "prediction": prediction,
        "correct": error is None and prediction != INVALID and prediction == label,
        "error": error,
        "latency": latency,
        "completion_tokens": tokens,
    }


def summarize(records: list[dict[str, Any]], latency: float) -> dict[str, Any]:
    n = len(records)
    correct = sum(1 for r in records if r["correct"])
    invalid = sum(1 for r in records if r["prediction"] == INVALID)
    tokens = sum(r["completion_tokens"] for r in records)
    reasons: dict[str, int] = {}
    for r in records:
        if r["error"] is not None:
            reasons[r["error"]] = reasons.get(r["error"], 0) + 1
    return {
        "num_questions": n,
        "num_correct": correct,
        "num_invalid": invalid,
        "num_errors": sum(reasons.values()),
        "errors": dict(sorted(reasons.items())),
        "accuracy": correct / n if n else 0.0,
        "invalid": invalid / n if n else 0.0,
        "latency": latency,
        "completion_tokens": tokens,
        "output_throughput": tokens / latency if latency > 0 else 0.0,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The console summary: SGLang's four lines, then the failed requests.

    The failed requests are counted, then grouped by reason, most frequent
    first (``  3  timeout``), one reason a line.
    """
    lines = [
        f"Accuracy: {summary['accuracy']:.3f}",
        f"Invalid: {summary['invalid']:.3f}",
        f"Latency: {summary['latency']:.3f} s",
        f"Output throughput: {summary['output_throughput']:.3f} token/s",
    ]
    errors = summary.get("errors") or {}
    failed = summary.get("num_errors", sum(errors.values()))
    total = summary.get("num_questions", 0)
    if not failed:
        lines.append(f"Failed requests: 0 of {total}")
        return "\n".join(lines)
    lines.append(f"Failed requests: {failed} of {total}, by reason:")
    width = len(str(max(errors.values(), default=0)))
    for reason, count in sorted(errors.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"  {count:>{width}}  {reason}")
    return "\n".join(lines)


def write_result(path: str | os.PathLike, result: dict[str, Any]) -> None:
    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n")
    tmp.replace(path)


class Interrupted(Exception):
    """Raised by :func:`evaluate` after saving a partial result on Ctrl-C."""

    def __init__(self, result: dict[str, Any]):
        super().__init__("interrupted")
        self.result = result


def evaluate(
    args: argparse.Namespace,
    train_rows: list[dict[str, Any]],
    test_rows: list[dict[str, Any]],
) -> dict[str, Any]:
    """Run every question, write ``args.result_file`` and return the result.

    On KeyboardInterrupt the questions answered so far are saved (with
    ``interrupted: true``) and :class:`Interrupted` is raised.
    """
    if args.api == "openai":
        args.model = pick_model_name(args)
    server_info, server_info_error = fetch_server_info(
        args.base_url, min(args.timeout, 30.0), args.api_key
    )
    backend = Backend(args)
    prompts = build_prompts(train_rows, test_rows, args.num_shots)
    records: list[dict[str, Any]] = []
    interrupted = False
    progress = make_progress(len(prompts), not args.no_progress)
    started = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=args.parallel)
    try:
        pending = {
            pool.submit(_one_question, backend, i, row, prompt)
            for i, (row, prompt) in enumerate(zip(test_rows, prompts, strict=False))
        }
        while pending and not interrupted:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                try:
                    records.append(fut.result())
                except KeyboardInterrupt:  # raised inside a worker
                    interrupted = True
                    continue
                progress.update(1)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        latency = time.perf_counter() - started
        # Queued questions are dropped; in-flight ones end within --timeout.
        pool.shutdown(wait=False, cancel_futures=True)
        progress.close()
    records.sort(key=lambda r: r["index"])
    result = {
        "summary": summarize(records, latency),
        "interrupted": interrupted,
        "num_questions_requested": len(test_rows),
        "config": {k: v for k, v in vars(args).items() if k != "api_key"},
        "server_info": server_info,
        "server_info_error": server_info_error,
        "records": records,
    }
    write_result(args.result_file, result)
    if interrupted:
        raise Interrupted(result)
    return result


class ServerUnreachable(Exception):
    """The server did not answer the start-up probe."""


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Probe, load, evaluate; for in-process callers (see :mod:`.matrix`).

    Raises :class:`DataError` / :class:`ServerUnreachable` for the exit-2 cases.
    """
    train_rows, test_rows = load_questions(args)
    message = probe_server(args)
    if message is not None:
        raise ServerUnreachable(message)
    return evaluate(args, train_rows, test_rows)


def main(argv: list[str] | None = None) -> int:
    prog = "sglang-dspark-dp-gsm8k"
    try:
        args = parse_args(argv)
        result = run(args)
    except SystemExit as exc:  # argparse: --help or a usage error
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    except (DataError, ServerUnreachable) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Interrupted as exc:
        print(format_summary(exc.result["summary"]))
        print(
            f"{prog}: interrupted; {len(exc.result['records'])} answered "
            f"question(s) saved to {args.result_file}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(format_summary(result["summary"]))
    print(f"Results written to {args.result_file}", file=sys.stderr)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
