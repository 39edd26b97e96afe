"""The benchmark tests run against the installed ``sglang-dspark-dp-bench``.

The benchmarks are their own distribution (``benchmark/pyproject.toml``); a
checkout is not importable as ``sglang_dspark_dp_bench`` until it is installed,
so a missing install stops the run here, with the command that fixes it.

Every test also gets an empty GSM8K cache folder and an unreachable download
URL, so no test reads ``~/.cache`` or downloads anything unless it says so.
"""

from __future__ import annotations

import socket

import pytest

try:
    from sglang_dspark_dp_bench.gsm8k import client as _client
except ImportError as _exc:
    raise ImportError(
        "the benchmark tests need the sglang-dspark-dp-bench distribution "
        f"installed ({_exc}): run `pip install -e benchmark` in this Python"
    ) from None


@pytest.fixture
def unreachable_url():
    """An ``http://`` URL base on a local port that refuses connections."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))  # bound but never listening: refused
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/gsm8k/"


@pytest.fixture(autouse=True)
def gsm8k_cache(tmp_path_factory, monkeypatch, unreachable_url):
    """The GSM8K cache folder of this test (empty, not created yet)."""
    cache_root = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv(_client.CACHE_ENV, str(cache_root))
    monkeypatch.setattr(_client, "GSM8K_URL_BASE", unreachable_url)
    return cache_root / "gsm8k"
