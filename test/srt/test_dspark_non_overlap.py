"""The non-overlap entry repair (SGLang #39262) on the installed release.

The installed ``Scheduler.run_batch``, overlap schedule off, runs on a
stand-in scheduler up to the installed ``DSparkWorkerV2.forward_batch_
generation`` (see ``drivers/scheduler.py``): stock must fail exactly where
the release is recorded to, and with the plugin every prefill and decode
step must reach the worker's body.
"""

from __future__ import annotations

import pytest
from known_releases import backport_fixes, known
from srt_helpers import restored

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter.scheduler import load_scheduler
from sglang_dspark_dp.adapter.worker import FORWARD
from sglang_dspark_dp.drivers.scheduler import non_overlap_step
from sglang_dspark_dp.outcome import Outcome
from sglang_dspark_dp.srt.managers import scheduler as entry

REPAIR = entry.REPAIR


@pytest.fixture
def restore():
    """Leave the repair as the test found it."""
    with restored(REPAIR) as repair:
        yield repair


def steps(api):
    module, cls = load_scheduler()
    _, worker_cls = adapter.load_worker()
    return [
        non_overlap_step(api, module, cls, worker_cls, prefill=p) for p in (True, False)
    ]


def test_stock_fails_exactly_where_recorded(api, sglang_version, restore):
    row = known(sglang_version)
    if row is None:
        pytest.fail(f"sglang {sglang_version} has no row in known_releases.py")
    REPAIR.uninstrument()
    got = steps(api)
    if row["non_overlap"]:
        for s in got:
            assert s.reached is None and "TypeError" in s.error, s
            assert "pp_proxy_tensors" in s.error
    else:
        assert all(s.ok for s in got), got


def test_with_the_plugin_every_step_reaches_the_worker(api, sglang_version, restore):
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    status = REPAIR.instrument(apply=True)
    assert status.outcome in (Outcome.ENABLED, Outcome.NOT_NEEDED), status.line()
    assert (status.outcome is Outcome.ENABLED) is known(sglang_version)["non_overlap"]
    assert all(s.ok for s in steps(api))


def test_the_hook_drops_only_a_none_and_passes_the_rest_through():
    seen = []

    def original(worker, *args, **kwargs):
        seen.append((worker, args, kwargs))
        return "result"

    out = entry.accept_pp_proxy_tensors(
        original, "w", "batch", on_publish="p", pp_proxy_tensors=None
    )
    assert out == "result"
    assert seen == [("w", ("batch",), {"on_publish": "p"})]
    entry.accept_pp_proxy_tensors(original, "w", "batch", None, "g")
    assert seen[-1] == ("w", ("batch", None, "g"), {})


def test_the_hook_refuses_pipeline_tensors_naming_them():
    class PPProxyTensors:  # what a pipeline stage would hand over
        pass

    def original(*args, **kwargs):
        raise AssertionError("must not be called")

    with pytest.raises(entry.PipelineTensorsError, match="pp_proxy_tensors=PPProxy"):
        entry.accept_pp_proxy_tensors(
            original, "w", "batch", pp_proxy_tensors=PPProxyTensors()
        )


def test_instrument_and_uninstrument_are_symmetric_and_idempotent(api, restore):
    _, worker_cls = adapter.load_worker()
    REPAIR.uninstrument()
    stock = worker_cls.__dict__[FORWARD]
    first = REPAIR.instrument(apply=True)
    again = REPAIR.instrument(apply=True)
    assert (again.outcome, again.reason) == (first.outcome, first.reason)
    patched = worker_cls.__dict__[FORWARD]
    assert (patched is not stock) is first.enabled
    REPAIR.uninstrument()
    REPAIR.uninstrument()
    assert worker_cls.__dict__[FORWARD] is stock
    assert adapter.hooks_on(entry.FORWARD_TARGET) == []
    assert not REPAIR.instrumented
