"""The relay-wait repair: ``ConfidenceRelay.resolve`` waits for a lagged
confidence copy still in flight, so every rank resolves the same
confidences (upstream's direction; in no release yet).

The installed relay is built on CPU, its ring filled with known values, its
copy events stand-ins that say whether their copy has landed and land when
waited for. The gloo runs drive the installed planner's overlap path with a
late rank (:mod:`sglang_dspark_dp.harness.compact_verify`).
"""

from __future__ import annotations

import pytest
import torch
from known_releases import known
from srt_helpers import enabled_or_skip, no_children_left, restored

from sglang_dspark_dp import adapter
from sglang_dspark_dp.adapter import planner as sg_planner
from sglang_dspark_dp.drivers import planner as standins
from sglang_dspark_dp.harness import compact_verify as cv
from sglang_dspark_dp.outcome import Outcome
from sglang_dspark_dp.srt.managers import overlap_utils

REPAIR = overlap_utils.REPAIR
POOL, GAMMA = 5, 3


@pytest.fixture
def repaired(sglang_version):
    with restored(REPAIR) as repair:
        enabled_or_skip(repair, sglang_version)
        yield repair


class Relay:
    """The installed relay on CPU, ``ring_pos`` steps in, every slot's
    confidences ``slot + row / 10`` and generations ``10 * slot + row``."""

    def __init__(self, ring_pos: int, landed: bool = False) -> None:
        _lag, depth = sg_planner.relay_lag_steps()
        self.events = [standins.CopyEvent(landed=lambda: landed) for _ in range(depth)]
        runner = standins.model_runner(
            req_pool_size=POOL, capture_num_tokens=[GAMMA], max_bs=POOL
        )
        self.relay = sg_planner.relay_on_cpu(
            pool=runner.req_to_token_pool,
            req_pool_size=POOL,
            gamma=GAMMA,
            events=self.events,
        )
        conf, gen = sg_planner.relay_ring_slot(self.relay, slice(None))
        for slot in range(depth):
            for row in range(POOL):
                conf[slot, row] = slot + row / 10
                gen[slot, row] = 10 * slot + row
        sg_planner.set_relay_position(self.relay, ring_pos)

    def resolve(self, rows=(3, 1), *, overlap: bool = True):
        batch = standins.decode_batch(req_pool_indices=torch.tensor(rows))
        if overlap:
            kwargs = {"stream": standins.CopyStream(), "publish_ready": object()}
        else:
            kwargs = {"stream": None, "publish_ready": None}
        return self.relay.resolve(batch, **kwargs)


def slot_read(ring_pos: int) -> int:
    lag, depth = sg_planner.relay_lag_steps()
    return (ring_pos - lag) % depth


def test_stock_answers_none_for_a_copy_in_flight(sglang_version):
    if not known(sglang_version)["late_relay"]:
        pytest.skip(f"sglang {sglang_version} waits for the copy")
    with restored(REPAIR) as repair:
        repair.uninstrument()
        lag, _ = sg_planner.relay_lag_steps()
        relay = Relay(ring_pos=lag + 1)
        assert relay.resolve() is None
        assert sum(e.waits for e in relay.events) == 0


def test_repaired_waits_once_and_returns_that_slot_in_batch_order(repaired):
    lag, depth = sg_planner.relay_lag_steps()
    for ring_pos in range(lag, lag + depth + 1):
        relay = Relay(ring_pos=ring_pos)
        got = relay.resolve(rows=(3, 1))
        slot = slot_read(ring_pos)
        assert got is not None
        conf, gen = sg_planner.resolved_values(got)
        assert torch.allclose(conf[:, 0], torch.tensor([slot + 0.3, slot + 0.1]))
        assert gen.tolist() == [10 * slot + 3, 10 * slot + 1]
        assert [e.waits for e in relay.events] == [
            1 if i == slot else 0 for i in range(depth)
        ]


def test_a_landed_copy_is_not_waited_for(repaired):
    lag, _ = sg_planner.relay_lag_steps()
    relay = Relay(ring_pos=lag + 2, landed=True)
    assert relay.resolve() is not None
    assert sum(e.waits for e in relay.events) == 0


def test_other_none_answers_stay_none_without_a_wait(repaired):
    """A ring not yet ``lag`` steps deep, a batch with no rows, a relay not
    yet set up: None, as stock, and nothing waited for. The non-overlap
    path reads the device buffer directly, as stock."""
    lag, _ = sg_planner.relay_lag_steps()
    shallow = Relay(ring_pos=lag - 1)
    assert shallow.resolve() is None
    empty = Relay(ring_pos=lag + 1)
    assert empty.resolve(rows=()) is None
    unset = Relay(ring_pos=lag + 1)
    unset.relay.initialized = False
    assert unset.resolve() is None
    for r in (shallow, empty, unset):
        assert sum(e.waits for e in r.events) == 0
    direct = Relay(ring_pos=lag + 1)
    got = direct.resolve(overlap=False)
    assert got is not None and sum(e.waits for e in direct.events) == 0


def test_status_names_the_change(repaired, sglang_version):
    line = repaired.status().line()
    assert line.startswith(
        f"sglang-dspark-dp: relay-wait: enabled on sglang {sglang_version} "
        "(relay-wait not in this build)"
    ), line


def test_late_rank_with_this_repair_alone(repaired, sglang_version):
    """The gloo ranks, overlap path, rank 1's copy late every 5th step:
    with only the relay's wait every rank enters every verify_lens
    broadcast; the drift half is not this repair's (it still diverges
    where the release lacks #31195)."""
    late = cv.run_compact_verify(
        cv.CompactConfig(
            scenario=cv.LATE, steps=20, late_every=5, repairs=("relay-wait",)
        )
    )
    assert no_children_left()
    assert late.complete and late.agree, late.summary()
    assert late.late_steps and all(s.broadcast == cv.ALL_IN for s in late.late_steps)
    drift = cv.run_compact_verify(
        cv.CompactConfig(scenario=cv.DRIFT, steps=20, repairs=("relay-wait",))
    )
    assert bool(drift.diverged) is known(sglang_version)["compact_verify"]


def test_instrument_and_uninstrument_are_symmetric(repaired):
    _module, cls = sg_planner.load_relay()
    target = sg_planner.RESOLVE_TARGET
    hooked = cls.__dict__[sg_planner.RESOLVE]
    assert adapter.is_patched(target) and len(adapter.hooks_on(target)) == 1
    assert repaired.instrument(apply=True).enabled
    assert cls.__dict__[sg_planner.RESOLVE] is hooked
    repaired.uninstrument()
    assert cls.__dict__[sg_planner.RESOLVE] is sg_planner.stock_resolve(cls)
    assert not adapter.is_patched(target) and adapter.hooks_on(target) == []
    repaired.uninstrument()  # no-op
    assert repaired.status().outcome is Outcome.NOT_INSTRUMENTED
