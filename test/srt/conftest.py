"""Fixtures for the regression suite against the installed SGLang.

Nothing here re-implements SGLang: the proposer, the batches, the admission
decision and the plugin loading are the installed code; only the draft runner
(a recorder) and the parallel state (``get_parallel().override``) stand in
for a GPU server.
"""

from __future__ import annotations

import contextlib
import os

import pytest

sglang = pytest.importorskip("sglang", reason="SGLang is not installed")

from sglang_dspark_dp.package import installed_sglang_version  # noqa: E402


@pytest.fixture(scope="session")
def sglang_version() -> str:
    return installed_sglang_version() or "unknown"


@pytest.fixture(scope="session")
def api():
    from sglang_dspark_dp.srt.speculative import dspark_worker

    return dspark_worker.load_sglang_api()


@pytest.fixture(scope="session")
def plugin(api):
    """The plugin loaded the way ``sglang serve`` loads it."""
    from sglang.srt.plugins import load_plugins

    from sglang_dspark_dp.srt.speculative import dspark_worker

    os.environ.pop("SGLANG_PLUGINS", None)
    load_plugins()
    return dspark_worker.state()


@pytest.fixture
def stock(plugin):
    """Run a test against stock SGLang: uninstrument, then instrument again."""
    from sglang_dspark_dp.srt.speculative import dspark_worker

    @contextlib.contextmanager
    def without_plugin():
        was = dspark_worker.is_instrumented()
        dspark_worker.uninstrument()
        try:
            yield
        finally:
            if was:
                dspark_worker.instrument(apply=True)

    return without_plugin


def pytest_terminal_summary(terminalreporter):
    from srt_helpers import SOAK_SUMMARIES

    if SOAK_SUMMARIES:
        terminalreporter.section("DP lockstep soak")
        for line in SOAK_SUMMARIES:
            terminalreporter.write_line(line)
