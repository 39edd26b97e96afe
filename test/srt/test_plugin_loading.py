"""How the plugin loads, declines and unloads, each in a fresh interpreter
where the load order matters (the way ``sglang serve`` starts)."""

from __future__ import annotations

import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from srt_helpers import enabled_or_skip, run_python

from sglang_dspark_dp import adapter, registry
from sglang_dspark_dp.package import _instruments
from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import REPAIR

ROOT = Path(__file__).resolve().parents[2]

LOAD = textwrap.dedent(
    """
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang_dspark_dp.adapter import TARGET
    from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import (
        REPAIR,
    )
    load_plugins()
    print("RESULT", REPAIR.instrumented, TARGET in HookRegistry._patched,
          REPAIR.status().outcome.name)
    """
)


#: The one line every process that loads the plugin logs first.
ARMED = " repairs armed on sglang "


def armed_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ARMED in line]


def plugin_lines(stderr: str) -> list[str]:
    """The repairs' lines (the armed line aside)."""
    return [
        line
        for line in stderr.splitlines()
        if "sglang-dspark-dp:" in line and ARMED not in line
    ]


def draft_lines(stderr: str) -> list[str]:
    return [line for line in plugin_lines(stderr) if f": {REPAIR.name}: " in line]


def result(stdout: str) -> list[str]:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT")]
    assert lines, stdout
    return lines[-1].split()[1:]


def test_load_plugins_logs_one_line_per_repair(plugin):
    proc = run_python(LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = plugin_lines(proc.stderr)
    assert len(lines) == len(registry.names()), lines
    lines = [line for line in lines if f": {REPAIR.name}: " in line]
    assert len(lines) == 1, lines
    instrumented, patched, *_ = result(proc.stdout)
    assert instrumented == patched == str(plugin.plan.patches)
    word = "repairing" if plugin.plan.patches else "not needed"
    assert word in lines[0]


@pytest.mark.parametrize(
    ("whitelist", "loaded"), [("dspark_dp", True), ("some_other_plugin", False)]
)
def test_sglang_plugins_whitelist(plugin, whitelist, loaded):
    proc = run_python(LOAD, env={"SGLANG_PLUGINS": whitelist})
    assert proc.returncode == 0, proc.stderr[-3000:]
    instrumented, patched, *_ = result(proc.stdout)
    expect = loaded and plugin.plan.patches
    assert instrumented == patched == str(expect)
    assert len(plugin_lines(proc.stderr)) == (len(registry.names()) if loaded else 0)
    assert len(armed_lines(proc.stderr)) == (1 if loaded else 0)


def test_disable_keeps_it_installed_and_patching_nothing(plugin):
    """``SGLANG_DSPARK_DP_DISABLE=1``: SGLang still loads the plugin, which
    says so in one line, arms nothing and patches nothing, even on a
    release whose draft batch needs the repair."""
    from sglang_dspark_dp.settings import DISABLE_ENV

    proc = run_python(LOAD, env={DISABLE_ENV: "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = plugin_lines(proc.stderr)
    assert lines == [
        line for line in lines if f"disabled by {DISABLE_ENV}; nothing patched" in line
    ]
    assert len(lines) == 1, lines
    assert armed_lines(proc.stderr) == []
    instrumented, patched, outcome = result(proc.stdout)
    assert (instrumented, patched, outcome) == ("False", "False", "NOT_INSTRUMENTED")


def test_sglang_without_dspark_gets_one_line_and_starts():
    # An SGLang build without the DSpark draft module: make its import fail.
    code = (
        "import sys\n"
        "sys.modules['sglang.srt.speculative.dspark_components.dspark_draft'] = None\n"
        + LOAD
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = draft_lines(proc.stderr)
    assert len(lines) == 1 and "not applicable" in lines[0], lines
    assert "no DSpark draft module" in lines[0]
    assert result(proc.stdout)[:2] == ["False", "False"]


@pytest.mark.parametrize(
    ("mutation", "reason"),
    [
        ("del P._fill_dp_moe_sync_metadata", "renamed target"),
        (
            "P._fill_dp_moe_sync_metadata = lambda self, fb: None",
            "unexpected signature",
        ),
    ],
)
def test_changed_target_gets_one_line_and_starts(mutation, reason):
    code = (
        "from sglang.srt.speculative.dspark_components.dspark_draft import "
        "DraftBlockProposer as P\n" + mutation + "\n" + LOAD
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = draft_lines(proc.stderr)
    assert len(lines) == 1 and "not applicable" in lines[0], lines
    assert reason in lines[0], lines
    assert result(proc.stdout)[:2] == ["False", "False"]


def test_no_plugin_api_gets_one_line():
    code = "import sys\nsys.modules['sglang.srt.plugins.hook_registry'] = None\n" + (
        "from sglang_dspark_dp.plugin import register\nregister()\nprint('RESULT ok')\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = draft_lines(proc.stderr)
    assert len(lines) == 1 and "no plugin API" in lines[0], lines


def test_instrument_uninstrument_symmetric_and_idempotent(api, plugin, sglang_version):
    from sglang.srt.plugins.hook_registry import HookRegistry

    enabled_or_skip(plugin, sglang_version)
    stock = plugin.original
    name = adapter.FILL
    assert api.proposer_cls.__dict__[name] is not stock
    plan = plugin.plan
    first = REPAIR.instrument()  # already instrumented: a no-op
    assert first.enabled and REPAIR.plan is plan
    assert len(HookRegistry._hooks[adapter.TARGET]) == 1
    REPAIR.uninstrument()
    REPAIR.uninstrument()  # twice is fine
    assert api.proposer_cls.__dict__[name] is stock
    assert adapter.TARGET not in HookRegistry._patched
    assert adapter.TARGET not in HookRegistry._hooks
    REPAIR.instrument()
    assert api.proposer_cls.__dict__[name] is not stock
    assert len(HookRegistry._hooks[adapter.TARGET]) == 1


def test_uninstrument_keeps_other_plugins_hooks(api, plugin, sglang_version):
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    enabled_or_skip(plugin, sglang_version)
    stock = plugin.original

    def other(result, *args, **kwargs):
        return None

    HookRegistry.register(adapter.TARGET, other, HookType.AFTER)
    try:
        REPAIR.uninstrument()
        HookRegistry.apply_hooks()
        current = api.proposer_cls.__dict__[adapter.FILL]
        assert current is not stock  # the other hook still wraps it
        assert current.__wrapped__ is stock
    finally:
        HookRegistry._hooks[adapter.TARGET] = [
            h for h in HookRegistry._hooks[adapter.TARGET] if h[1] is not other
        ]
        setattr(api.proposer_cls, adapter.FILL, stock)
        HookRegistry._patched.discard(adapter.TARGET)
        HookRegistry._hooks.pop(adapter.TARGET, None)
        REPAIR.instrument()


def test_supported_range_declared_once_and_optional():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["dependencies"] == []
    extra = pyproject["project"]["optional-dependencies"]["sglang"]
    assert [e.replace(" ", "") for e in extra] == [
        i.replace(" ", "") for i in _instruments
    ]
    requires = metadata.requires("sglang-dspark-dp") or []
    assert all("extra ==" in r for r in requires), requires
    from sglang_dspark_dp.plugin import ENTRY_POINT, PLUGIN_GROUP, PLUGIN_NAME

    declared = pyproject["project"]["entry-points"][PLUGIN_GROUP]
    assert declared == {PLUGIN_NAME: ENTRY_POINT}
    eps = metadata.entry_points(group=PLUGIN_GROUP)
    assert any(ep.name == PLUGIN_NAME and ep.value == ENTRY_POINT for ep in eps)
