"""The startup decision (SGLang issue #39886; #33614 and #39954): every rank
of the draft's capture group makes the same draft CUDA-graph capture
decision, repaired by startup-capture where the worker reads free memory by
its own name (0.5.16-0.5.18) and by capture-group-memory where the reading
goes through ``SpecTpSync`` (0.5.19 on).

The gloo runs drive the installed ``DSparkWorkerV2.init_cuda_graphs`` in one
process per rank (:mod:`sglang_dspark_dp.harness.startup`), one rank short of
memory (0.6 GiB) and the others not (40 GiB); the capturing ranks enter a
barrier on the capture group, as the real capture does, so a disagreement
shows as a detected hang. The other tests drive the method in this process
on a stand-in worker, with a recorder in place of SGLang's memory helper.
"""

from __future__ import annotations

import logging
import multiprocessing as mp

import pytest
from known_releases import known
from srt_helpers import enabled_or_skip, no_children_left, restored

from sglang_dspark_dp import adapter
from sglang_dspark_dp.drivers import worker as standins
from sglang_dspark_dp.harness import startup
from sglang_dspark_dp.outcome import Outcome
from sglang_dspark_dp.registry import NotNeeded
from sglang_dspark_dp.srt.speculative.dspark_components import dspark_worker_v2

REPAIR = dspark_worker_v2.REPAIR

#: Which topologies each tested release's stock worker gets wrong with the
#: default environment: 0.5.16/0.5.17 read rank-local memory everywhere;
#: 0.5.23 reduces through SpecTpSync on plain TP but not under DP attention
#: with attention TP 1 (its SpecTpSync group has one rank and drops every
#: site). On 0.5.23 plain TP goes wrong once SGLANG_SPEC_TP_SYNC leaves the
#: dspark-mem site out.
#: The SGLANG_SPEC_TP_SYNC value that takes the memory site out.
NO_MEM_SITE = "all,-dspark-mem"

TOPOLOGIES = {
    "tp2": dict(tp=2),
    "tp4": dict(tp=4),
    "tp8": dict(tp=8),
    "dp4": dict(tp=4, dp=4),  # DP attention, attention TP 1 (MoE draft)
}
HANG_S = 2.0


@pytest.fixture(scope="module")
def worker():
    return adapter.load_worker()


@pytest.fixture
def restore_repair():
    """Leave the repair as the test found it."""
    with restored(REPAIR) as repair:
        yield repair


def stock_wrong(version: str, kind: str) -> bool:
    if known(version) is None:
        pytest.skip(f"stock behaviour of sglang {version} is not recorded")
    return known(version)[f"startup_{kind}"]


def run(**kwargs) -> startup.StartupResult:
    result = startup.run_startup(startup.StartupConfig(hang_s=HANG_S, **kwargs))
    assert no_children_left()
    assert len(result.ranks) == result.config.world
    return result


# --------------------------------------------------------------------------
# Stock SGLang: ranks on both sides of the cutoff disagree.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_stock_ranks_diverge_with_straddling_memory(worker, sglang_version, topology):
    kind = "dp" if "dp" in TOPOLOGIES[topology] else "tp"
    env = None if stock_wrong(sglang_version, kind) else NO_MEM_SITE
    result = run(fix=False, spec_tp_sync=env, **TOPOLOGIES[topology])
    # Stock: no startup repair runs on any rank (whatever the parent held).
    assert not [
        (r.rank, st["repair"])
        for r in result.ranks
        for st in r.statuses
        if st["repair"] in startup.STARTUP_REPAIRS and st["outcome"] == "enabled"
    ]
    assert not result.agree
    assert result.hung, result.divergence
    short = result.ranks[-1]
    assert (short.decision, short.reduced) == (startup.SKIPPED, False)
    assert short.read_gib == pytest.approx(startup.SHORT_GIB, abs=1e-3)
    for r in result.ranks[:-1]:
        assert (r.decision, r.reduced) == (startup.HUNG, False)
        assert r.read_gib == pytest.approx(startup.PLENTY_GIB, abs=1e-3)
    last = result.config.tp - 1
    assert f"rank {last} read 0.60 GiB (rank-local) and skipped" in (result.divergence)
    assert "40.00 GiB (rank-local), entered draft capture and hung" in (
        result.divergence
    )


def test_stock_plain_tp_on_a_release_that_reduces_there(worker, sglang_version):
    """Where a release already reduces on plain TP (0.5.23), stock agrees."""
    if stock_wrong(sglang_version, "tp"):
        pytest.skip(f"sglang {sglang_version} reads rank-local memory on plain TP")
    result = run(fix=False, tp=4)
    assert result.correct, result.divergence
    assert all(r.reduced for r in result.ranks)


# --------------------------------------------------------------------------
# Repaired: one decision, from the capture group's minimum.
# --------------------------------------------------------------------------


@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_repaired_ranks_all_skip_below_the_cutoff(worker, topology):
    result = run(fix=True, **TOPOLOGIES[topology])
    assert result.repair["outcome"] in (
        Outcome.ENABLED.value,
        Outcome.NOT_NEEDED.value,
    ), result.repair
    assert result.agree, result.divergence
    assert result.decision == startup.SKIPPED == result.expected
    assert result.divergence == ""
    for r in result.ranks:
        assert r.reduced
        assert r.read_gib == pytest.approx(startup.SHORT_GIB, abs=1e-3)


@pytest.mark.parametrize("topology", ["tp4", "dp4"])
def test_repaired_ranks_all_capture_above_the_cutoff(worker, topology):
    cfg = TOPOLOGIES[topology]
    free = (40.0, 40.0, 1.5, 40.0)
    result = run(fix=True, free_gib=free, **cfg)
    assert result.agree, result.divergence
    assert result.decision == startup.CAPTURED == result.expected
    assert all(r.read_gib == pytest.approx(1.5, abs=1e-3) for r in result.ranks)


@pytest.mark.parametrize("topology", ["tp4", "dp4"])
def test_a_rank_whose_probe_fails_brings_its_group_to_stock_not_to_a_hang(
    worker, topology
):
    """The repair adds a collective; one rank's probe fails (an unexpected
    exception) while the others' succeed. The ranks agree before the first
    use: all run stock, none waits in a reduction the failing rank never
    enters. (Above the cutoff everywhere, so stock's own decisions agree.)"""
    cfg = dict(TOPOLOGIES[topology], free_gib=(40.0, 40.0, 3.0, 40.0))
    result = run(fix=True, probe_fails=(1,), **cfg)
    assert not result.hung, result.divergence
    assert result.agree and result.decision == startup.CAPTURED
    assert [r.repair for r in result.ranks] == [
        "not applicable" if r == 1 else "enabled" for r in range(4)
    ]
    failed = {st["repair"]: st for st in result.ranks[1].statuses}
    assert "probe fault injected on rank 1" in failed[result.repair["repair"]]["reason"]
    stock = run(fix=False, **cfg)  # what every rank reads without the plugin
    assert [(r.read_gib, r.reduced) for r in result.ranks] == [
        (r.read_gib, r.reduced) for r in stock.ranks
    ]


@pytest.mark.parametrize("topology", ["tp4", "dp4"])
def test_folded_sampling_decision(worker, sglang_version, topology):
    """Every rank has room to capture, one has too little for the folded
    sampling buffers (the stand-in model's need plus SGLang's headroom): the
    installed folded-sampling decision, stock, splits the ranks where its
    reading is rank-local; repaired, every rank decides alike (without)."""
    row = known(sglang_version)
    if row is None:
        pytest.skip(f"stock behaviour of sglang {sglang_version} is not recorded")
    kind = "tp" if topology.startswith("tp") else "dp"
    cfg = dict(TOPOLOGIES[topology], free_gib=(40.0, 40.0, 1.5, 40.0))
    stock = run(fix=False, **cfg)
    assert not stock.hung and {r.decision for r in stock.ranks} == {startup.CAPTURED}
    folded = [r.folded for r in stock.ranks]
    if not row["folded"]:
        assert folded == [None] * 4
    elif row[f"startup_{kind}"]:
        assert folded == [True, True, False, True], stock.summary()
        assert "disagree on folded sampling" in stock.summary()
    else:
        assert folded == [False] * 4
    fixed = run(fix=True, **cfg)
    assert fixed.agree, fixed.divergence
    assert [r.folded for r in fixed.ranks] == (
        [False] * 4 if row["folded"] else [None] * 4
    )


def test_a_setting_without_the_memory_site_is_honoured(worker, sglang_version):
    """Where the reading goes through SpecTpSync, SGLANG_SPEC_TP_SYNC decides
    whether it is reduced, with the plugin as with #39954: a setting that
    leaves the memory site out keeps it rank-local (the repair warns). Where
    the worker reads memory by its own name, the setting does not reach it."""
    module, _cls = worker
    result = run(fix=True, tp=2, spec_tp_sync=NO_MEM_SITE)
    if hasattr(module, "SpecTpSync"):
        assert result.hung and not any(r.reduced for r in result.ranks)
        assert result.repair["repair"] == "capture-group-memory"
    else:
        assert result.correct, result.divergence
        assert all(r.reduced for r in result.ranks)
        assert result.repair["repair"] == "startup-capture"


#: Worlds of several capture groups, as servers lay them out: two TP
#: groups side by side (the second's ranks are [2, 3]), plain TP and DP
#: attention inside; a dense draft under DP attention with attention TP 2,
#: whose graphs capture on the attention-TP groups [0, 1] and [2, 3]. The
#: short rank is rank 3 (in the second group): the first group must still
#: capture, the second skip. ``kind``: which recorded stock behaviour
#: applies (a dense draft's SpecTpSync group has two ranks, as under plain
#: TP).
GROUPED = {
    "2x tp2": (dict(tp=2, groups=2), "tp"),
    "2x tp2 dp2": (dict(tp=2, dp=2, groups=2), "dp"),
    "tp4 dp2 dense": (dict(tp=4, dp=2, dense_draft=True), "tp"),
}


@pytest.mark.parametrize("topology", list(GROUPED))
def test_each_capture_group_decides_from_its_own_minimum(
    worker, sglang_version, topology
):
    cfg, kind = GROUPED[topology]
    fixed = run(fix=True, **cfg)
    assert fixed.group_kind == "GroupCoordinator"
    assert [r.group for r in fixed.ranks] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert fixed.correct, fixed.summary()
    assert [r.decision for r in fixed.ranks] == [startup.CAPTURED] * 2 + [
        startup.SKIPPED
    ] * 2
    assert all(r.reduced for r in fixed.ranks)
    stock = run(fix=False, **cfg)
    first = stock.ranks[:2]
    assert all(r.decision == startup.CAPTURED for r in first), stock.summary()
    if stock_wrong(sglang_version, kind):
        assert stock.hung and (stock.ranks[2].decision, stock.ranks[3].decision) == (
            startup.HUNG,
            startup.SKIPPED,
        ), stock.summary()
    else:
        assert stock.correct, stock.summary()


def test_the_hook_reduces_over_the_workers_own_capture_group_first(
    worker, restore_repair, sglang_version
):
    """Where a worker names its capture group (``_draft_graph_group``) and
    its draft runner has another TP group, the reading is reduced over the
    worker's own."""
    enabled_or_skip(restore_repair, sglang_version)
    module, cls = worker
    own = standins.ProbeGroup(world_size=2, rank_in_group=1)
    runners = standins.ProbeGroup(world_size=4, rank_in_group=3)
    told: list[bool] = []
    stand_in = standins.WorkerStandIn(
        module,
        capture_group=runners,
        dp_tp_group=standins.ProbeGroup(1),
        on_capture=told.append,
    )
    stand_in._draft_graph_group = own
    recorded = standins.RecordedReadings(
        adapter.memory_helper_sites(module, stand_in), value=2.0
    )
    with adapter.pretend_cuda(module), recorded:
        getattr(cls, adapter.INIT_GRAPHS)(stand_in)
    assert recorded.readings
    assert {(r.distributed, r.cpu_group) for r in recorded.readings} == {
        (True, own.cpu_group)
    }
    assert told == [True]


def test_run_matrix_runs_each_topology(worker):
    results = startup.run_matrix(topologies=((2, 1), (2, 2)), hang_s=HANG_S)
    assert no_children_left()
    assert [(r.config.tp, r.config.dp) for r in results] == [(2, 1), (2, 2)]
    assert all(r.correct for r in results), [r.summary() for r in results]
    assert "all 2 ranks skipped draft CUDA graphs" in results[1].summary()


def test_single_rank_passes_through(worker):
    result = run(fix=True, tp=1)
    assert result.correct
    assert result.ranks[0].reduced is False  # nothing to reduce over


# --------------------------------------------------------------------------
# In-process: the probe, the hook's fallbacks, instrument/uninstrument.
# --------------------------------------------------------------------------


def drive(cls, module, capture_group, *, free: float = 0.5):
    """Run ``init_cuda_graphs`` (as the class holds it now) on a stand-in;
    return (readings, capture decisions)."""
    told: list[bool] = []
    worker = standins.WorkerStandIn(
        module,
        capture_group=capture_group,
        dp_tp_group=standins.ProbeGroup(1),
        on_capture=told.append,
    )
    recorded = standins.RecordedReadings(
        adapter.memory_helper_sites(module, worker), value=free
    )
    with adapter.pretend_cuda(module), recorded:
        getattr(cls, adapter.INIT_GRAPHS)(worker)
    return recorded.readings, told


@pytest.mark.parametrize("instrumented", [False, True])
def test_probe_finds_the_rank_local_reading(
    worker, sglang_version, restore_repair, instrumented
):
    """The probe reads the method as SGLang wrote it, hooked or not."""
    module, cls = worker
    if known(sglang_version) is None:
        pytest.skip(f"stock behaviour of sglang {sglang_version} is not recorded")
    if instrumented:
        restore_repair.instrument(apply=True)
    else:
        restore_repair.uninstrument()
    result = dspark_worker_v2.probe(module, cls)
    assert result.readings and not result.reduced
    expected = (
        dspark_worker_v2.SHAPE_TP_SYNC
        if hasattr(module, "SpecTpSync")
        else dspark_worker_v2.SHAPE_MODULE_NAME
    )
    assert result.shape == expected
    assert result.captured is True  # the probe's figure is above the cutoff


def test_hook_falls_back_to_stock_when_the_group_is_missing(
    worker, restore_repair, caplog, sglang_version
):
    module, cls = worker
    enabled_or_skip(restore_repair, sglang_version)
    no_cpu_group = adapter.GroupShape(world_size=2, rank_in_group=0)
    with caplog.at_level(logging.WARNING, logger="sglang_dspark_dp"):
        readings, told = drive(cls, module, no_cpu_group, free=0.5)
    ours = [r for r in caplog.records if r.name == "sglang_dspark_dp"]
    assert len(ours) == 1, [r.getMessage() for r in ours]
    assert "capture group was not found" in ours[0].getMessage()
    assert "\n" not in ours[0].getMessage()
    assert [r.distributed for r in readings] == [False]  # stock reading
    assert told == [False]  # the stock decision from it (0.5 < 1.0)


def test_hook_reduces_over_the_capture_group_in_process(
    worker, restore_repair, sglang_version
):
    module, cls = worker
    enabled_or_skip(restore_repair, sglang_version)
    group = standins.ProbeGroup(world_size=4, rank_in_group=1)
    readings, told = drive(cls, module, group, free=2.0)
    # The capture decision's reading, and the folded-sampling decision's
    # where the release reads its own (0.5.17-0.5.18): all reduced.
    assert readings
    assert {(r.distributed, r.cpu_group) for r in readings} == {(True, group.cpu_group)}
    assert told == [True]
    # One rank: nothing to reduce over, the stock reading as it was.
    readings, _ = drive(cls, module, standins.ProbeGroup(world_size=1), free=2.0)
    assert readings and not any(r.distributed for r in readings)


def test_hook_changes_nothing_outside_the_call(worker, restore_repair, sglang_version):
    module, cls = worker
    enabled_or_skip(restore_repair, sglang_version)
    helper_before = getattr(module, adapter.MEMORY_HELPER, None)
    told: list[bool] = []
    stand_in = standins.WorkerStandIn(
        module,
        capture_group=standins.ProbeGroup(2),
        dp_tp_group=standins.ProbeGroup(1),
        on_capture=told.append,
    )
    recorded = standins.RecordedReadings(
        adapter.memory_helper_sites(module, stand_in), value=2.0
    )
    with adapter.pretend_cuda(module), recorded:
        getattr(cls, adapter.INIT_GRAPHS)(stand_in)
    assert getattr(module, adapter.MEMORY_HELPER, None) is helper_before
    assert told == [True]
    tp_sync = vars(stand_in).get("_tp_sync")
    if tp_sync is not None:
        assert "available_memory_gb" not in vars(tp_sync)
        # No sync site was turned on (its group has one rank: none is on).
        sites = getattr(module, "SpecTpSyncSite", ())
        assert not any(tp_sync.enabled(site) for site in sites)


def test_instrument_and_uninstrument_are_symmetric_and_idempotent(
    worker, restore_repair, sglang_version
):
    module, cls = worker
    enabled_or_skip(restore_repair, sglang_version)
    restore_repair.uninstrument()
    restore_repair.uninstrument()  # no-op
    stock_fn = cls.__dict__[adapter.INIT_GRAPHS]
    assert not adapter.is_patched(adapter.STARTUP_TARGET)
    assert restore_repair.status().outcome is Outcome.NOT_INSTRUMENTED
    first = restore_repair.instrument(apply=True)
    hooked = cls.__dict__[adapter.INIT_GRAPHS]
    assert hooked is not stock_fn
    assert adapter.is_patched(adapter.STARTUP_TARGET)
    assert len(adapter.hooks_on(adapter.STARTUP_TARGET)) == 1
    again = restore_repair.instrument(apply=True)
    assert again == first
    assert cls.__dict__[adapter.INIT_GRAPHS] is hooked
    assert len(adapter.hooks_on(adapter.STARTUP_TARGET)) == 1
    restore_repair.uninstrument()
    assert cls.__dict__[adapter.INIT_GRAPHS] is stock_fn
    assert not adapter.is_patched(adapter.STARTUP_TARGET)
    assert adapter.hooks_on(adapter.STARTUP_TARGET) == []
    restore_repair.uninstrument()
    assert cls.__dict__[adapter.INIT_GRAPHS] is stock_fn
    assert restore_repair.instrument(apply=True).outcome is Outcome.ENABLED
    assert len(adapter.hooks_on(adapter.STARTUP_TARGET)) == 1


# --------------------------------------------------------------------------
# A release that already reduces over the capture group: left untouched.
# --------------------------------------------------------------------------


def reducing_init_cuda_graphs(self):
    """A stand-in "fixed release": asks SGLang's helper for the capture
    group's minimum, then decides as the stock worker does."""
    from sglang.srt import utils

    group = self.draft_model_runner.tp_group
    many = group.world_size > 1
    free = utils.get_available_gpu_memory(
        self.device,
        self.gpu_id,
        distributed=many,
        cpu_group=group.cpu_group if many else None,
    )
    self._draft_worker.init_cuda_graphs(
        capture_decode_cuda_graph=free >= adapter.CAPTURE_CUTOFF_GIB
    )


def assert_left_untouched(cls):
    before = cls.__dict__[adapter.INIT_GRAPHS]
    hooks_before = adapter.hooks_on(adapter.STARTUP_TARGET)
    fresh = dspark_worker_v2.StartupCaptureRepair()
    answer = fresh.setup_once()
    assert isinstance(answer, NotNeeded), answer
    assert "already reduces" in answer.reason
    status = fresh.instrument(apply=True)
    assert status.outcome is Outcome.NOT_NEEDED, status.line()
    assert not fresh.instrumented
    assert cls.__dict__[adapter.INIT_GRAPHS] is before
    assert adapter.hooks_on(adapter.STARTUP_TARGET) == hooks_before


def test_not_needed_where_init_cuda_graphs_already_reduces(worker, monkeypatch):
    _module, cls = worker
    monkeypatch.setattr(cls, adapter.INIT_GRAPHS, reducing_init_cuda_graphs)
    assert_left_untouched(cls)


def test_not_needed_where_the_reading_goes_through_spec_tp_sync(worker):
    """From 0.5.19 the worker reads through SpecTpSync: this repair leaves it
    to capture-group-memory (test_capture_group_memory.py)."""
    module, cls = worker
    if not hasattr(module, "SpecTpSync"):
        pytest.skip("this release's worker reads free memory by its own name")
    fresh = dspark_worker_v2.StartupCaptureRepair()
    status = fresh.instrument(apply=True)
    assert status.outcome is Outcome.NOT_NEEDED, status.line()
    assert "capture-group-memory" in status.reason
    assert not fresh.instrumented
    assert [v.line() for v in status.verdicts] == [
        "#33614 spec-tp-sync: in this build: the startup reading goes through "
        "SpecTpSync.available_memory_gb"
    ]


# --------------------------------------------------------------------------
# Bad input.
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(tp=0), ("tp", "0")),
        (dict(tp=True), ("tp", "True")),
        (dict(tp=6, dp=4), ("dp", "dp=4", "tp=6")),
        (dict(tp=2, free_gib=(1.0,)), ("free_gib", "tp=2", "(1.0,)")),
        (dict(tp=2, free_gib=(1.0, -2.0)), ("free_gib[1]", "-2.0")),
        (dict(tp=2, free_gib=(1.0, float("nan"))), ("free_gib[1]", "nan")),
        (dict(hang_s=5.0, timeout_s=5.0), ("hang_s", "5.0")),
        (dict(timeout_s=0), ("timeout_s", "0")),
    ],
)
def test_bad_config_names_the_field(kwargs, words):
    with pytest.raises(startup.CannotRun) as err:
        startup.run_startup(startup.StartupConfig(**kwargs))
    for word in words:
        assert word in str(err.value)
    assert not mp.active_children()
