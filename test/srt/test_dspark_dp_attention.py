"""Regression suite: DSpark's draft batch under DP attention and EP.

Runs against the installed SGLang: a real ``DraftBlockProposer`` builds the
draft ``ForwardBatch`` (busy ranks through ``_run_forward``, idle ranks
through ``run_idle_participation``), a recording draft runner hands it to a
real ``DecodeCudaGraphRunner.can_run_graph``, the topology of each DP rank is
set with ``get_parallel().override(...)``, and the plugin is loaded with
``sglang.srt.plugins.load_plugins()``.
"""

from __future__ import annotations

import re

import oracle
import pytest
import torch
from known_releases import known as known_release
from known_releases import skip_unless_carried

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import parallel_override
from sglang_dspark_dp.drivers import DRAFT_WIDTH, MAX_CAPTURE_BS, builders
from sglang_dspark_dp.drivers.draft import (
    DraftDriver,
    capture_sizes,
    graph_runner,
    padded_bs,
)
from sglang_dspark_dp.expectations import KNOWN_CRASH
from sglang_dspark_dp.srt.speculative.dspark_components.dspark_draft import REPAIR

GAMMA = DRAFT_WIDTH
MAX_BS = MAX_CAPTURE_BS
CAPTURE = capture_sizes(MAX_BS)
SIZES = [*CAPTURE, MAX_BS + 1]
DP_SIZES = (2, 4, 8)
EP = {"ep_off": 1, "ep_on": None}  # None: EP = DP size (--ep N)


def make_drivers(api, plugin, *, dp: int, ep: int):
    names = plugin.probe_result.names
    graph = graph_runner(api, dp_size=dp, width=GAMMA, capture_bs=CAPTURE)
    drivers = []
    for rank in range(dp):
        with parallel_override(api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=ep):
            drivers.append(
                DraftDriver(
                    api, gamma=GAMMA, dp_moe_sync=True, graph=graph, names=names
                )
            )
    return drivers


def step_all(api, drivers, counts, *, ep: int):
    """One decode step on every DP rank, the scheduler's logprob row unlike
    its token row (``oracle.logprob_row``); returns what each runner saw and
    whether SGLang wants the non-padded device count under that topology."""
    seen, wants_device_count = [], []
    dp = len(drivers)
    for rank, driver in enumerate(drivers):
        with parallel_override(api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=ep):
            wants_device_count.append(bool(api.enable_num_token_non_padded()))
            seen.append(
                driver.step(
                    counts[rank],
                    list(counts),
                    global_num_tokens_for_logprob=oracle.logprob_row(counts),
                )
            )
    return seen, wants_device_count


def stock_scaled(api, plugin, driver, counts):
    """The four scaled rows as SGLang's own stock fill computes them."""
    fb = builders.make_draft_forward_batch(
        api,
        bs=1,
        width=GAMMA,
        spec_info=driver.proposer._draft_block_spec_info,
        device="cpu",
    )
    batch = builders.make_schedule_batch(
        api,
        seq_lens=torch.full((1,), 8, dtype=torch.int64),
        global_num_tokens=list(counts),
        global_num_tokens_for_logprob=oracle.logprob_row(counts),
    )
    adapter.stock_fill(api)(driver.proposer, fb, batch)
    return {
        "scaled_cpu": fb.global_num_tokens_cpu,
        "scaled_logprob_cpu": fb.global_num_tokens_for_logprob_cpu,
        "scaled_gpu": fb.global_num_tokens_gpu,
        "scaled_logprob_gpu": fb.global_num_tokens_for_logprob_gpu,
    }


def counts_for(size: int, dp: int, pattern: str) -> list[int]:
    """Per-rank request counts whose maximum is ``size``: ``mixed`` leaves
    every odd rank idle, ``busy`` keeps every rank busy."""
    out = [size]
    for r in range(1, dp):
        if pattern == "mixed" and r % 2:
            out.append(0)
        else:
            out.append(max(1, size // (r + 1)))
    return out


def check_step(api, plugin, drivers, counts, *, ep: int, graph_ok: bool = True):
    seen, wants = step_all(api, drivers, counts, ep=ep)
    dp = len(drivers)
    width = drivers[0].width
    assert width == GAMMA
    assert all(s is not None for s in seen), "every DP rank must run a draft forward"
    decisions = [s.admitted for s in seen]
    assert len(set(decisions)) == 1, f"ranks disagree on admission: {decisions}"
    expect_admit = graph_ok and max(counts) <= MAX_BS
    assert decisions[0] is expect_admit, (counts, decisions)
    buckets = [padded_bs(CAPTURE, max(s.fields["unscaled"])) for s in seen]
    assert len(set(buckets)) == 1, f"ranks pad to different graphs: {buckets}"
    if max(counts) in CAPTURE:
        assert buckets[0] == max(counts)

    with parallel_override(api.get_parallel, dp_size=dp, dp_rank=0, ep_size=ep):
        stock = stock_scaled(api, plugin, drivers[0], counts)
    total = 0
    for rank, (s, want_device) in enumerate(zip(seen, wants, strict=False)):
        f = s.fields
        where = f"rank {rank} of dp {dp}, counts {counts}"
        step = oracle.Step.of(
            drivers[rank].spec_info,
            requests=counts[rank],
            counts=counts,
            logprob_counts=oracle.logprob_row(counts),
            device_count=want_device,
            device=drivers[rank].runner.device,
        )
        assert oracle.mismatches(f, step) == {}, where
        # The scaled rows are stock's too (stock computes them on every
        # release), host lists and device vectors, tokens and logprobs.
        for key, value in stock.items():
            assert oracle.held(f[key]) == oracle.held(value), (key, where)
        total += f["non_padded_cpu"]
    assert total == sum(counts) * width


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("ep_name", list(EP))
@pytest.mark.parametrize("dp", DP_SIZES)
def test_dp_lockstep_every_capture_size(api, plugin, dp, ep_name, size, sglang_version):
    skip_unless_carried(sglang_version, "dp")
    ep = EP[ep_name] or dp
    drivers = make_drivers(api, plugin, dp=dp, ep=ep)
    for pattern in ("mixed", "busy"):
        check_step(api, plugin, drivers, counts_for(size, dp, pattern), ep=ep)


@pytest.mark.parametrize("dp", DP_SIZES)
def test_all_idle_and_single_busy_steps(api, plugin, dp, sglang_version):
    skip_unless_carried(sglang_version, "dp")
    ep = dp
    drivers = make_drivers(api, plugin, dp=dp, ep=ep)
    check_step(api, plugin, drivers, [0] * dp, ep=ep)
    for busy in range(dp):
        counts = [0] * dp
        counts[busy] = 3
        check_step(api, plugin, drivers, counts, ep=ep)
    # The same proposers again: persistent buffers must not leak old values.
    check_step(api, plugin, drivers, [MAX_BS] + [1] * (dp - 1), ep=ep)
    check_step(api, plugin, drivers, [0] * dp, ep=ep)


def test_dp_graph_vetoed_by_scheduler_is_eager_everywhere(api, plugin, sglang_version):
    skip_unless_carried(sglang_version, "dp")
    dp = 4
    drivers = make_drivers(api, plugin, dp=dp, ep=dp)
    seen = []
    for rank, driver in enumerate(drivers):
        with parallel_override(api.get_parallel, dp_size=dp, dp_rank=rank, ep_size=dp):
            seen.append(driver.step([2, 0, 1, 2][rank], [2, 0, 1, 2], False))
    assert [s.admitted for s in seen] == [False] * dp


@pytest.mark.parametrize("attn_tp", (2, 4))
def test_attention_tp_without_dp_attention_with_ep(
    api, plugin, attn_tp, sglang_version
):
    """``--tp N --ep N`` without DP attention: the proposer skips the DP
    fill, yet the EP MoE still needs the non-padded counts."""
    skip_unless_carried(sglang_version, "local")
    graph = graph_runner(api, dp_size=1, width=GAMMA, capture_bs=CAPTURE)
    names = plugin.probe_result.names
    for bs in (1, 7, MAX_BS, MAX_BS + 1):
        for rank in range(attn_tp):
            topo = dict(
                dp_size=1, attn_tp_size=attn_tp, attn_tp_rank=rank, ep_size=attn_tp
            )
            with parallel_override(api.get_parallel, **topo):
                driver = DraftDriver(
                    api, gamma=GAMMA, dp_moe_sync=False, graph=graph, names=names
                )
                seen = driver.step(bs, None)
            assert seen.admitted is (bs <= MAX_BS)
            step = oracle.Step.of(
                driver.spec_info,
                requests=bs,
                counts=None,  # no DP metadata without DP attention
                logprob_counts=None,
                device_count=True,  # EP on
            )
            assert oracle.mismatches(seen.fields, step) == {}


def test_stock_crash_reproduces_where_expected(api, plugin, stock, sglang_version):
    """On 0.5.16 stock SGLang must still crash in ``can_run_graph``: if it
    ever stops, this test says so."""
    known = known_release(sglang_version)
    if known is None:
        pytest.skip(f"no recorded behaviour for sglang {sglang_version}")
    with stock():
        assert not REPAIR.instrumented
        for path_bs in (3, 0):  # busy path, then idle path
            drivers = make_drivers(api, plugin, dp=2, ep=2)
            rank = 0 if path_bs else 1
            counts = [3, 0]
            with parallel_override(
                api.get_parallel, dp_size=2, dp_rank=rank, ep_size=2
            ):
                if known["dp"]:
                    with pytest.raises(TypeError, match=re.escape(KNOWN_CRASH)):
                        drivers[rank].step(path_bs, counts)
                else:
                    seen = drivers[rank].step(path_bs, counts)
                    assert seen.admitted is True


def test_stock_attention_tp_leaves_non_padded_unset_where_expected(
    api, plugin, stock, sglang_version
):
    known = known_release(sglang_version)
    if known is None:
        pytest.skip(f"no recorded behaviour for sglang {sglang_version}")
    graph = graph_runner(api, dp_size=1, width=GAMMA, capture_bs=CAPTURE)
    with stock():
        with parallel_override(api.get_parallel, dp_size=1, attn_tp_size=2, ep_size=2):
            driver = DraftDriver(
                api,
                gamma=GAMMA,
                dp_moe_sync=False,
                graph=graph,
                names=plugin.probe_result.names,
            )
            seen = driver.step(5, None)
    if known["local"]:
        assert seen.fields["non_padded"] is None
    else:
        assert seen.fields["non_padded"].value == 5 * GAMMA


@pytest.mark.parametrize("path", ["dp", "local"])
def test_untouched_paths_are_identical_with_and_without_plugin(
    api, plugin, stock, path
):
    """Where the stock path is complete, the plugin's values are stock's,
    field for field: untouched, or (a blocking stock DP fill) replaced by a
    non-blocking one that writes the same values."""
    found = plugin.probe_result
    if found.missing_dp if path == "dp" else found.missing_local:
        pytest.skip(f"this SGLang needs the {path} path repaired")
    if path == "dp" and found.blocking:
        assert plugin.plan.dp_groups and not plugin.plan.dp_calls_stock
    names = plugin.probe_result.names

    def run():
        out = []
        if path == "dp":
            drivers = make_drivers(api, plugin, dp=4, ep=4)
            for counts in ([3, 0, 1, 128], [0, 0, 0, 0], [129, 2, 0, 5]):
                seen, _ = step_all(api, drivers, counts, ep=4)
                out.append([(s.admitted, s.fields) for s in seen])
        else:
            graph = graph_runner(api, dp_size=1, width=GAMMA, capture_bs=CAPTURE)
            with parallel_override(
                api.get_parallel, dp_size=1, attn_tp_size=2, ep_size=2
            ):
                driver = DraftDriver(
                    api, gamma=GAMMA, dp_moe_sync=False, graph=graph, names=names
                )
                for bs in (1, 9, 129):
                    s = driver.step(bs, None)
                    out.append((s.admitted, s.fields))
        return out

    with_plugin = run()
    with stock():
        without = run()
    assert with_plugin == without


def test_sglang_unit_test_style_patch_reaches_the_repair(api, plugin, sglang_version):
    """SGLang's own unit-test style: a bare proposer, no process groups,
    ``enable_num_token_non_padded`` patched to True where the stock fill
    looks it up. The repaired fill must honour the patch (upstream's fill
    does on 0.5.17), not call the real function and need an EP group."""
    skip_unless_carried(sglang_version, "dp")
    from types import SimpleNamespace
    from unittest import mock

    draft = api.draft_module
    where = draft if hasattr(draft, "enable_num_token_non_padded") else api.fbi_module
    proposer = api.proposer_cls.__new__(api.proposer_cls)
    proposer._dp_moe_sync = True
    proposer._draft_block_spec_info = api.make_spec_info(
        draft_token_num=GAMMA, device="cpu"
    )
    proposer.draft_model_runner = SimpleNamespace(device="cpu")
    proposer._num_token_non_padded = None  # what newer __init__s set; unused
    fb = builders.make_draft_forward_batch(
        api, bs=2, width=GAMMA, spec_info=proposer._draft_block_spec_info, device="cpu"
    )
    counts = [2, 3]
    batch = SimpleNamespace(
        global_num_tokens=counts,
        global_num_tokens_for_logprob=oracle.logprob_row(counts),
        can_run_dp_cuda_graph=True,
        can_run_decode_cuda_graph=True,
        is_extend_in_batch=False,
        dp_spec_prefill_coordination_applied=False,
    )
    names = plugin.probe_result.names
    with mock.patch.object(where, "enable_num_token_non_padded", return_value=True):
        proposer._fill_dp_moe_sync_metadata(fb, batch)
    step = oracle.Step.of(
        proposer._draft_block_spec_info,
        requests=2,
        counts=counts,
        logprob_counts=oracle.logprob_row(counts),
        device_count=True,
        graph_ok=True,
    )
    assert oracle.mismatches(oracle.by_key(fb, names), step) == {}
