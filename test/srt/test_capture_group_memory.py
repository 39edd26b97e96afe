"""The capture-group-memory repair (SGLang PR #39954, issue #39886):
``SpecTpSync.available_memory_gb`` reduces over the group it is passed.

On releases with ``SpecTpSync`` (0.5.19 on) the DSpark worker takes its
startup memory reading through it, passing the draft capture group; an
instance built on a one-rank group (DP attention, attention TP 1) reads
this rank's memory alone. Tests here call the installed method on instances
built the way SGLang's own tests build them (bare groups, ``mock.patch``
on the module's helper) and drive the startup harness with this repair
alone; on releases without ``SpecTpSync`` there is nothing to test and
they skip, saying so.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from unittest import mock

import pytest
from known_releases import known
from srt_helpers import enabled_or_skip, no_children_left, restored

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import spec_sync as sg_sync
from sglang_dspark_dp.harness import startup
from sglang_dspark_dp.outcome import Outcome
from sglang_dspark_dp.registry import NotNeeded
from sglang_dspark_dp.srt.speculative import spec_tp_sync

REPAIR = spec_tp_sync.REPAIR


@pytest.fixture(scope="module")
def sync():
    try:
        return sg_sync.load_sync()
    except Exception as exc:
        pytest.skip(f"this release has no SpecTpSync to repair ({exc})")


@pytest.fixture
def repaired(sglang_version):
    with restored(REPAIR) as repair:
        enabled_or_skip(repair, sglang_version)
        yield repair


def read(module, cls, own, passed, site=None):
    """One reading through the installed method (as the class holds it
    now), the module's helper patched; returns the helper's kwargs."""
    site = site or sg_sync.memory_site(module)
    target = f"{module.__name__}.{sg_sync.MEMORY_HELPER}"
    with mock.patch(target, return_value=3.0) as helper:
        got = cls(own).available_memory_gb(site, "cuda", 0, group=passed)
    assert got == 3.0
    (call,) = helper.call_args_list
    return call.kwargs


def test_stock_reads_rank_locally_when_its_own_group_has_one_rank(sync, sglang_version):
    row = known(sglang_version)
    if not row["startup_dp"]:
        pytest.skip(f"sglang {sglang_version} carries #39954")
    module, cls = sync
    with restored(REPAIR) as repair:
        repair.uninstrument()
        kwargs = read(module, cls, SimpleNamespace(world_size=1), _group(2))
    assert kwargs["distributed"] is False and kwargs["cpu_group"] is None


def _group(size):
    return SimpleNamespace(world_size=size, rank_in_group=0, cpu_group=object())


def test_repaired_reduces_over_the_group_it_is_passed(sync, repaired):
    module, cls = sync
    passed = _group(4)
    kwargs = read(module, cls, SimpleNamespace(world_size=1), passed)
    assert kwargs["distributed"] is True and kwargs["cpu_group"] is passed.cpu_group


def test_repaired_keeps_stock_where_the_constructor_group_is_many(sync, repaired):
    module, cls = sync
    group = _group(2)
    kwargs = read(module, cls, group, group)
    assert kwargs["distributed"] is True and kwargs["cpu_group"] is group.cpu_group


def test_a_group_of_one_reads_rank_locally(sync, repaired):
    module, cls = sync
    kwargs = read(module, cls, SimpleNamespace(world_size=1), _group(1))
    assert kwargs["distributed"] is False


@pytest.mark.parametrize(
    "setting, reduced", [("off", False), ("all,-dspark-mem", False), ("init", True)]
)
def test_the_setting_is_honoured_and_a_left_out_site_warns_once(
    sync, repaired, monkeypatch, caplog, setting, reduced
):
    module, cls = sync
    monkeypatch.setenv(sg_sync.SETTING, setting)
    monkeypatch.setattr(spec_tp_sync, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="sglang_dspark_dp"):
        for _ in range(2):
            kwargs = read(module, cls, SimpleNamespace(world_size=1), _group(2))
            assert kwargs["distributed"] is reduced
    ours = [r.getMessage() for r in caplog.records if r.name == "sglang_dspark_dp"]
    if reduced:
        assert ours == []
    else:
        assert len(ours) == 1, ours
        assert f"{sg_sync.SETTING}={setting!r} leaves dspark-mem out" in ours[0]
        assert "startup can hang" in ours[0] and "2 ranks" in ours[0]


def test_other_methods_are_untouched(sync, repaired):
    """Runtime broadcasts of an instance on a one-rank group stay off."""
    module, cls = sync
    group = SimpleNamespace(world_size=1, broadcast=mock.MagicMock())
    instance = cls(group)
    site = sg_sync.memory_site(module)
    assert not instance.enabled(site)
    for member in getattr(module, sg_sync.SITES):
        instance.sync(member, mock.MagicMock())
    group.broadcast.assert_not_called()


def test_a_bare_instance_is_served(sync, repaired):
    """SGLang's unit-test style: ``__new__`` with only the group set."""
    module, cls = sync
    bare = cls.__new__(cls)
    bare._tp_group = SimpleNamespace(world_size=1)
    passed = _group(2)
    target = f"{module.__name__}.{sg_sync.MEMORY_HELPER}"
    with mock.patch(target, return_value=1.5) as helper:
        assert bare.available_memory_gb(
            sg_sync.memory_site(module), "cuda", 0, group=passed
        ) == pytest.approx(1.5)
    assert helper.call_args.kwargs["cpu_group"] is passed.cpu_group


def test_status_names_the_change(sync, repaired, sglang_version):
    line = repaired.status().line()
    assert line.startswith(
        f"sglang-dspark-dp: capture-group-memory: enabled on sglang {sglang_version} "
        "(#39954 not in this build)"
    ), line


def test_startup_under_dp_attention_agrees_with_this_repair_alone(sync, repaired):
    """The gloo ranks: DP attention (attention TP 1), one rank short, the
    worker's SpecTpSync on a one-rank group. With the repair every rank
    reads the capture group's minimum and skips."""
    result = startup.run_startup(startup.StartupConfig(tp=4, dp=4, hang_s=2.0))
    assert no_children_left()
    assert result.repair["repair"] == "capture-group-memory"
    assert result.correct, result.divergence
    assert all(r.reduced for r in result.ranks)


def test_instrument_and_uninstrument_are_symmetric(sync, repaired):
    _module, cls = sync
    target = sg_sync.READING_TARGET
    hooked = cls.__dict__[sg_sync.READING]
    assert adapter.is_patched(target) and len(adapter.hooks_on(target)) == 1
    assert repaired.instrument(apply=True).enabled
    assert cls.__dict__[sg_sync.READING] is hooked
    repaired.uninstrument()
    assert cls.__dict__[sg_sync.READING] is sg_sync.stock_reading(cls)
    assert not adapter.is_patched(target) and adapter.hooks_on(target) == []
    repaired.uninstrument()  # no-op
    assert repaired.status().outcome is Outcome.NOT_INSTRUMENTED


def test_not_needed_where_the_reading_already_reduces(sync, monkeypatch):
    """A stand-in "fixed release" (written for this test): the method
    reduces over the group it is passed when that group has many ranks."""
    module, cls = sync

    def reducing(self, site, device, gpu_id, *, group):
        many = group.world_size > 1
        return getattr(module, sg_sync.MEMORY_HELPER)(
            device,
            gpu_id,
            distributed=many,
            cpu_group=group.cpu_group if many else None,
        )

    monkeypatch.setattr(cls, sg_sync.READING, reducing)
    fresh = spec_tp_sync.CaptureGroupMemoryRepair()
    answer = fresh.setup_once()
    assert isinstance(answer, NotNeeded), answer
    assert [v.state.value for v in fresh.verdicts] == ["in this build"]
    assert fresh.instrument(apply=True).outcome is Outcome.NOT_NEEDED
    assert cls.__dict__[sg_sync.READING] is reducing


def test_not_needed_without_spec_tp_sync(sglang_version):
    """0.5.16-0.5.18: the worker reads memory itself; startup-capture's."""
    try:
        sg_sync.load_sync()
    except Exception:
        fresh = spec_tp_sync.CaptureGroupMemoryRepair()
        status = fresh.instrument(apply=True)
        assert status.outcome is Outcome.NOT_NEEDED, status.line()
        assert "startup-capture" in status.reason
        assert fresh.stock_verdicts() == ()
        return
    pytest.skip(f"sglang {sglang_version} has SpecTpSync")
