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

from known_releases import backport_fixes  # noqa: E402

from sglang_dspark_dp.package import installed_sglang_version  # noqa: E402


@pytest.fixture(scope="session")
def sglang_version() -> str:
    return installed_sglang_version() or "unknown"


@pytest.fixture(scope="session")
def api():
    from sglang_dspark_dp import adapter

    return adapter.load_sglang_api()


@pytest.fixture(scope="session")
def plugin(api):
    """The draft-batch repair, loaded the way ``sglang serve`` loads it.

    In backport mode (``SGLANG_DSPARK_DP_BACKPORT``, see ``known_releases``)
    the plugin stays off: the repair only probes (its ``probe_result`` and
    ``plan`` say what the build needs) and the suite judges SGLang alone."""
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )

    if backport_fixes():
        REPAIR.setup_once()  # probe only: nothing registered, nothing patched
        return REPAIR
    os.environ.pop("SGLANG_PLUGINS", None)
    # load_plugins(), then DSpark's worker imported, as a scheduler does.
    adapter.load_plugins()
    return REPAIR


@pytest.fixture
def stock(plugin):
    """Run a test against stock SGLang: uninstrument, then instrument again."""

    @contextlib.contextmanager
    def without_plugin():
        was = plugin.instrumented
        plugin.uninstrument()
        try:
            yield
        finally:
            if was:
                plugin.instrument(apply=True)

    return without_plugin


@pytest.fixture(scope="session")
def short_verify(plugin):
    """One short ``verify`` each way (startup and decode phases, 2 ranks),
    shared by every test that reads them."""
    from srt_helpers import SHORT_VERIFY, cli

    return {"fixed": cli(SHORT_VERIFY), "stock": cli([*SHORT_VERIFY, "--no-fix"])}


def pytest_terminal_summary(terminalreporter):
    from srt_helpers import SOAK_SUMMARIES

    if SOAK_SUMMARIES:
        terminalreporter.section("DP lockstep soak")
        for line in SOAK_SUMMARIES:
            terminalreporter.write_line(line)
