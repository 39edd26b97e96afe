"""The relay-wait repair: every rank resolves the lagged draft confidences,
waiting for a copy still in flight instead of answering None alone.

Counterpart of ``sglang/srt/managers/overlap_utils.py``. Under overlap
scheduling with a budget-scheduling ragged verify mode, the verify planner
reads the previous steps' draft confidences through
``ConfidenceRelay.resolve``, from a host ring filled by an asynchronous
device-to-host copy. On every release that ships DSpark (0.5.16-0.5.23),
``resolve`` answers None when that copy has not landed yet (its event's
``query()`` is False). Whether a copy has landed is rank-local, so on one
rank the budget is None and that rank skips the ``verify_lens`` broadcast
its peers enter. Upstream's direction (its test
``test/registered/spec/dspark/test_dspark_confidence_relay.py``,
``test_unfinished_copy_is_waited_for``; in no release yet) is to wait for
the copy.

The hook is an AROUND hook on ``resolve``: the stock method; where it
answered None because the ring slot it reads holds a copy still in flight
(and only then), it waits for that copy's event and asks the stock method
again, which then returns the slot's confidences. Every other answer is the
stock one. It adds no collective; the wait costs the remainder of one small
copy, on the steps where it has not landed.

Nothing is decided by version string: :func:`probe` drives the installed
relay on CPU with a ring slot whose copy is pending (stand-in events that
land when waited for) and looks at what ``resolve`` returns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sglang_dspark_dp.adapter import hook_registry
from sglang_dspark_dp.adapter import planner as sg_planner
from sglang_dspark_dp.drivers import planner as standins
from sglang_dspark_dp.isolation import isolated
from sglang_dspark_dp.outcome import DidNotEnable
from sglang_dspark_dp.registry import Hook, NotNeeded, Repair
from sglang_dspark_dp.upstream import State, Verdict

CHANGE = "relay-wait"

#: The probe's relay: a pool of 4 request rows, draft width 4, the batch's
#: rows in an order that is not the pool's.
_POOL, _GAMMA, _ROWS = 4, 4, (2, 0)


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """What ``resolve`` did with a ring slot whose copy was in flight."""

    resolved: bool  # it returned confidences
    waited: bool  # it waited for the slot's copy
    exact: bool  # what it returned is the slot's rows of the batch

    @property
    def waits(self) -> bool:
        return self.resolved and self.waited and self.exact

    def describe(self) -> str:
        if self.waits:
            return "resolve waited for the copy in flight and returned its rows"
        if not self.resolved:
            return "resolve returned None for a copy still in flight (no wait)"
        return (
            f"resolve returned confidences (waited: {self.waited}, the slot's rows: "
            f"{self.exact})"
        )


@isolated
def probe(around: Any = None) -> ProbeResult:
    """Call the installed ``resolve`` (through ``around`` if given) on the
    installed relay, set up on CPU with a ring slot whose copy is pending."""
    import torch

    _module, cls = sg_planner.load_relay()
    lag, depth = sg_planner.relay_lag_steps()
    events = [standins.CopyEvent(landed=lambda: False) for _ in range(depth)]
    runner = standins.model_runner(
        req_pool_size=_POOL, capture_num_tokens=[_GAMMA], max_bs=_POOL
    )
    try:
        relay = sg_planner.relay_on_cpu(
            pool=runner.req_to_token_pool,
            req_pool_size=_POOL,
            gamma=_GAMMA,
            events=events,
        )
        confidence, generation = sg_planner.relay_ring_slot(relay, slice(None))
        cells = confidence.numel()
        confidence.copy_(torch.arange(cells).view(confidence.shape) / cells)
        generation.copy_(torch.arange(generation.numel()).view(generation.shape))
        sg_planner.set_relay_position(relay, lag + 1)
        slot = (lag + 1 - lag) % depth
        rows = torch.tensor(_ROWS, dtype=torch.int64)
        batch = standins.decode_batch(req_pool_indices=rows)
        fn = sg_planner.stock_resolve(cls)
        kwargs = {"stream": standins.CopyStream(), "publish_ready": object()}
        if around is None:
            got = fn(relay, batch, **kwargs)
        else:
            got = around(fn, relay, batch, **kwargs)
    except DidNotEnable:
        raise
    except Exception as exc:
        raise DidNotEnable(
            f"could not drive the installed {sg_planner.RELAY}.{sg_planner.RESOLVE} "
            f"on CPU: {type(exc).__name__}: {exc}"
        ) from exc
    exact = False
    if got is not None:
        conf, gen = sg_planner.resolved_values(got)
        want_conf, want_gen = sg_planner.relay_ring_slot(relay, slot)
        exact = torch.equal(conf, want_conf[rows]) and torch.equal(gen, want_gen[rows])
    return ProbeResult(
        resolved=got is not None, waited=events[slot].waits > 0, exact=exact
    )


def verdicts(result: ProbeResult) -> tuple[Verdict, ...]:
    if result.waits:
        return (Verdict(CHANGE, State.IN, result.describe()),)
    return (
        Verdict(
            CHANGE,
            State.NOT_IN,
            f"{result.describe()}: a rank whose lagged copy is late schedules no "
            "verify budget and leaves the verify_lens broadcast its peers enter",
        ),
    )


def make_around(cls: type) -> Any:
    """The AROUND hook on ``ConfidenceRelay.resolve``."""
    sig = sg_planner.resolve_signature(cls)

    def wait_for_lagged_copy(original: Any, relay: Any, *args: Any, **kwargs: Any):
        resolved = original(relay, *args, **kwargs)
        if resolved is not None:
            return resolved
        bound = sig.bind(relay, *args, **kwargs)
        event = sg_planner.pending_copy(
            relay,
            bound.arguments["batch"],
            bound.arguments["stream"],
            bound.arguments["publish_ready"],
        )
        if event is None:
            return resolved
        event.synchronize()
        return original(relay, *args, **kwargs)

    return wait_for_lagged_copy


class RelayWaitRepair(Repair):
    """Makes ``ConfidenceRelay.resolve`` wait for a lagged copy in flight."""

    name = CHANGE
    stands_in_for = (CHANGE,)

    def __init__(self) -> None:
        super().__init__()
        self.probe_result: ProbeResult | None = None

    def stock_verdicts(self) -> tuple[Verdict, ...]:
        return verdicts(probe())

    def setup_once(self) -> Hook | NotNeeded:
        hook_registry()  # DidNotEnable without SGLang's plugin API
        _module, cls = sg_planner.load_relay()
        stock = probe()
        self.probe_result = stock
        self.found(verdicts(stock))
        detail = {"target": sg_planner.RESOLVE_TARGET, "stock": stock.describe()}
        if stock.waits:
            return NotNeeded(f"{stock.describe()}; nothing patched", detail)
        around = make_around(cls)
        check = probe(around)
        if not check.waits:
            raise DidNotEnable(
                f"the hook does not make resolve wait ({check.describe()})"
            )
        detail["repaired"] = check.describe()
        return Hook(
            target=sg_planner.RESOLVE_TARGET,
            owner=cls,
            attr=sg_planner.RESOLVE,
            around=around,
            reason=(
                f"{sg_planner.RELAY}.{sg_planner.RESOLVE} answers None on a rank "
                "whose lagged confidence copy has not landed; waiting for that "
                "copy, so every rank resolves the same confidences"
            ),
            detail=detail,
        )


REPAIR = RelayWaitRepair()
