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


#: ``--tp 4 --dp 2 --enable-dp-attention``: two attention-TP ranks per DP
#: rank. Global TP rank -> (DP rank, attention-TP rank).
TP4_DP2 = [(tp // 2, tp % 2) for tp in range(4)]


def tp4_dp2_step(api, names, *, tp_rank, bs, counts, ep_size=4):
    """The real proposer's draft forward on global TP rank ``tp_rank`` of
    ``--tp 4 --dp 2`` with the guard on; ``counts`` are the scheduler's
    gathered per-DP-rank request counts, ``bs`` this rank's own requests."""
    dp_rank, attn_tp_rank = TP4_DP2[tp_rank]
    with parallel_override(
        api.get_parallel,
        dp_size=2,
        dp_rank=dp_rank,
        ep_size=ep_size,
        attn_tp_size=2,
        attn_tp_rank=attn_tp_rank,
    ):
        driver = DraftDriver(api, gamma=4, dp_moe_sync=True, names=names)
        return driver.step(bs, counts)


@pytest.mark.parametrize("tp_rank", range(4))
def test_guard_at_tp4_dp2_checks_each_rank_against_its_own_dp_count(
    api, guarded, tp_rank
):
    """On every rank of ``--tp 4 --dp 2``, rank 0 included: a healthy step
    passes whichever DP rank holds more requests, and a step whose real
    draft tokens exceed this DP rank's padded count (the gathered count of
    this DP rank is one short of its requests) is named, with this DP rank.
    A guard that read the global TP rank, or skipped a rank, would pass the
    first or raise on the second (or the other way round)."""
    names = REPAIR.probe_result.names
    dp_rank = TP4_DP2[tp_rank][0]
    for counts in ([3, 1], [1, 3]):
        bs = counts[dp_rank]
        seen = tp4_dp2_step(api, names, tp_rank=tp_rank, bs=bs, counts=counts)
        assert seen.fields["non_padded_cpu"] == bs * 4
        assert seen.fields["unscaled"] == counts
    # This DP rank runs one request more than the scheduler's gathered count
    # says: its padded count, counts[dp_rank] x 4, is below its real tokens.
    counts = [2, 2]
    with pytest.raises(DSparkDPMetadataError, match="exceeds this rank's padded") as e:
        tp4_dp2_step(api, names, tp_rank=tp_rank, bs=3, counts=counts)
    assert e.value.field == names.non_padded_cpu
    assert e.value.rank == dp_rank
    assert f"on DP rank {dp_rank}" in str(e.value)
