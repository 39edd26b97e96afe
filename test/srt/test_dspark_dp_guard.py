"""The opt-in runtime guard (SGLANG_DSPARK_DP_CHECK=1)."""

from __future__ import annotations

import pytest
import torch

from sglang_dspark_dp.adapter import parallel_override
from sglang_dspark_dp.drivers import builders
from sglang_dspark_dp.drivers.draft import DraftDriver
from sglang_dspark_dp.srt.speculative import dspark_dp_guard
from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import REPAIR
from sglang_dspark_dp.srt.speculative.dspark_dp_guard import (
    DSparkDPMetadataError,
    check_draft_batch,
)


@pytest.fixture
def guarded(plugin):
    """The plugin re-instrumented with the guard on, as the env var does."""
    REPAIR.uninstrument()
    REPAIR.instrument(apply=True, guard=True)
    try:
        yield REPAIR.plan
    finally:
        REPAIR.uninstrument()
        REPAIR.instrument(apply=True)


def test_guard_is_off_by_default(plugin, monkeypatch):
    monkeypatch.delenv(dspark_dp_guard.GUARD_ENV, raising=False)
    assert dspark_dp_guard.guard_enabled() is False
    assert plugin.plan.guard is False
    monkeypatch.setenv(dspark_dp_guard.GUARD_ENV, "1")
    assert dspark_dp_guard.guard_enabled() is True


def test_guard_passes_healthy_steps(api, guarded):
    assert guarded.guard and REPAIR.instrumented
    names = REPAIR.probe_result.names
    for rank, bs in enumerate([5, 0, 2, 0]):
        with parallel_override(api.get_parallel, dp_size=4, dp_rank=rank, ep_size=4):
            driver = DraftDriver(api, gamma=4, dp_moe_sync=True, names=names)
            seen = driver.step(bs, [5, 0, 2, 0])
            assert seen.fields["non_padded_cpu"] == bs * 4


def real_batch(api, names, *, counts, rank, bs):
    with parallel_override(
        api.get_parallel, dp_size=len(counts), dp_rank=rank, ep_size=2
    ):
        driver = DraftDriver(api, gamma=4, dp_moe_sync=True, names=names)
        seen = driver.step(bs, counts)
    return driver, seen.forward_batch


@pytest.mark.parametrize(
    ("field", "corrupt", "message"),
    [
        ("unscaled", lambda v: v[:-1], "one entry per DP rank"),
        ("unscaled", lambda v: [-1, *v[1:]], "non-negative ints"),
        ("scaled_cpu", lambda v: [x + 1 for x in v], "unscaled x draft block width"),
        ("non_padded_cpu", lambda v: v + 1, "exceeds"),
        ("non_padded", lambda v: v.to(torch.int64), "int32"),
        ("non_padded", lambda v: None, "device int32 scalar"),
    ],
)
def test_guard_names_field_rank_and_values(api, plugin, field, corrupt, message):
    names = plugin.probe_result.names
    counts = [3, 1]
    driver, fb = real_batch(api, names, counts=counts, rank=1, bs=1)
    # The repaired batch is valid ...
    batch = builders.make_schedule_batch(
        api, seq_lens=torch.full((1,), 8, dtype=torch.int64), global_num_tokens=counts
    )
    with parallel_override(api.get_parallel, dp_size=2, dp_rank=1, ep_size=2):
        check_draft_batch(driver.proposer, fb, batch, names=names, api=api)
        # ... and each corruption is named.
        name = getattr(names, field)
        setattr(fb, name, corrupt(getattr(fb, name)))
        with pytest.raises(DSparkDPMetadataError, match=message) as info:
            check_draft_batch(driver.proposer, fb, batch, names=names, api=api)
    assert info.value.field == name
    assert info.value.rank == 1
    assert f"{name} on DP rank 1" in str(info.value)
    assert "got" in str(info.value)


def test_an_unknown_guard_value_means_off_and_says_so_once(monkeypatch, caplog):
    monkeypatch.setenv(dspark_dp_guard.GUARD_ENV, "maybe")
    with caplog.at_level("WARNING", logger="sglang_dspark_dp"):
        assert dspark_dp_guard.guard_enabled() is False
        assert dspark_dp_guard.guard_enabled() is False
    said = [r.getMessage() for r in caplog.records if "maybe" in r.getMessage()]
    assert len(said) == 1, said
    assert dspark_dp_guard.GUARD_ENV in said[0] and "stays off" in said[0]
    monkeypatch.setenv(dspark_dp_guard.GUARD_ENV, "on")
    assert dspark_dp_guard.guard_enabled() is True
