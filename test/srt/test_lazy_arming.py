"""The plugin costs nothing where DSpark does not run: ``load_plugins()``
only arms the repairs, and each is probed, hooked and applied when DSpark's
module it patches is first imported.

One fresh interpreter (not the fork server, which has DSpark imported
already) walks a server's order: ``server_args`` imported, then
``load_plugins()`` as ``sglang serve`` calls it in its HTTP process, then
the scheduler's module (the HTTP process imports it too), then DSpark's
worker module, as the scheduler imports it when it builds its speculative
worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from known_releases import backport_fixes, needs

from sglang_dspark_dp import adapter, registry

SERVER_ORDER = textwrap.dedent(
    """
    import json, logging, sys
    import sglang.srt.server_args
    from sglang_dspark_dp import adapter, registry

    lines = []
    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())
    logging.getLogger("sglang_dspark_dp").addHandler(Keep())

    def state():
        from sglang.srt.plugins.hook_registry import HookRegistry
        ours = {s.repair: s.outcome.value for s in registry.status()}
        hooked = sorted(
            t for t, hooks in HookRegistry._hooks.items()
            if any(getattr(h[1], "__module__", "").startswith("sglang_dspark_dp")
                   for h in hooks)
        )
        return {"repairs": ours, "hooked": hooked, "lines": list(lines)}

    before = set(sys.modules)
    from sglang.srt.plugins import load_plugins
    load_plugins()
    added = sorted(m for m in set(sys.modules) - before
                   if m == "sglang" or m.startswith("sglang."))
    report = {"added": added, "loaded": state()}
    import sglang.srt.managers.scheduler
    report["scheduler"] = state()
    import importlib
    importlib.import_module(adapter.WORKER_MODULE)
    report["dspark"] = state()
    report["patched"] = {
        t: t in __import__("sglang.srt.plugins.hook_registry",
                           fromlist=["x"]).HookRegistry._patched
        for t in (adapter.TARGET, adapter.STARTUP_TARGET)
    }
    print("REPORT " + json.dumps(report))
    """
)


@pytest.fixture(scope="module")
def server_order():
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    proc = subprocess.run(
        [sys.executable, "-c", SERVER_ORDER],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "SGLANG_PLUGINS": "dspark_dp"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("REPORT ")]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return json.loads(line[-1][len("REPORT ") :])


def test_load_plugins_imports_nothing_of_sglang_and_only_arms(server_order):
    # Nothing of SGLang's is imported on the plugin's account: the HTTP and
    # tokenizer process pays only for the plugin's own small modules.
    assert server_order["added"] == []
    loaded = server_order["loaded"]
    assert set(loaded["repairs"].values()) == {"not instrumented"}
    assert loaded["hooked"] == []
    assert len(loaded["lines"]) == 1, loaded["lines"]
    armed = loaded["lines"][0]
    assert "repairs armed on sglang" in armed
    assert all(name in armed for name in registry.names())


def test_the_scheduler_module_alone_arms_nothing(server_order):
    # The HTTP process imports the scheduler module (it names the scheduler
    # process's entry), whose overlap module holds ConfidenceRelay: still no
    # probe, no hook, no line beyond the armed one.
    sched = server_order["scheduler"]
    assert set(sched["repairs"].values()) == {"not instrumented"}
    assert sched["hooked"] == []
    assert len(sched["lines"]) == 1, sched["lines"]


def test_importing_dspark_applies_every_repair_the_release_needs(
    server_order, sglang_version
):
    wanted = needs(sglang_version)
    if wanted is None:
        pytest.fail(f"sglang {sglang_version} has no row in known_releases.py")
    got = server_order["dspark"]["repairs"]
    want = {
        name: "enabled" if wanted.get(name, False) else "not needed"
        for name in registry.names()
    }
    assert got == want
    # One line per repair, after the armed line, and the hooks applied
    # before the worker's module is handed back to its importer.
    lines = server_order["dspark"]["lines"][1:]
    assert [line.split(": ")[1] for line in lines] == registry.names()
    assert server_order["patched"][adapter.TARGET] is wanted["draft-batch"]
    assert server_order["patched"][adapter.STARTUP_TARGET] is wanted["startup-capture"]
