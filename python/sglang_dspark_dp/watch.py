"""The consensus watch: every rank of a group compares DSpark's control-plane
decisions with the others', off the scheduler's critical path, and names
the first one they part ways on.

On when ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER`` (SGLang's own switch of its
rank consensus checker) is on, on every release. Where SGLang's checker is
configured and compares over exactly a watched group (plain TP, 0.5.19+),
every per-step event also goes to its ``assert_same``, so SGLang's own
checker sees DSpark's decisions. The design is SGLang's
checker's (``sglang/srt/utils/rank_consensus_checker.py``, 0.5.19+), on a
group of the plugin's own: a :class:`Channel` per decision group, that is a
dedicated gloo process group over the group's ranks (made by its members
alone), a queue and a daemon thread. The scheduler thread only enqueues
(:meth:`Channel.note`); the thread drains in lock-step with its peers (the
minimum queue length over the group, then the batch's SHA-1 compared by
its minimum and maximum), so nothing runs on the model's stream and
nothing waits on the scheduler's critical path. A startup decision, taken
once before the collective it leads to, is checked synchronously
(:meth:`Channel.check_now`): the divergence is a report, not the hang.

On a mismatch the ranks gather their events (``all_gather_object`` on the
dedicated group; the values, not hashes) and every rank logs one critical
line naming the decision and the step, every rank's value, the upstream
change the decision belongs to and whether a repair stands in for it in
this process; then, where ``TORCH_FR_BUFFER_SIZE`` is set, it dumps the
flight recorder, and it ends the process (``os._exit(1)``, as SGLang's
checker does) unless ``SGLANG_DSPARK_DP_WATCH=log``, which only logs (the
first divergence of each decision).

All or none: a group is watched only if every rank of it can watch (the
ranks agree as the repairs do, :mod:`sglang_dspark_dp.consensus`); a rank
that cannot says so in one line and its group serves unwatched. Off, none
of this exists: no hook, no thread, no group.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import hashlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from sglang_dspark_dp.settings import (
    WATCH_ENV,
    WATCH_MODE_ENV,
    WATCH_MODES,
    WATCH_TIMEOUT_ENV,
    choice,
    switch,
)

logger = logging.getLogger("sglang_dspark_dp")

EXIT, LOG = WATCH_MODES
#: The name the watch agrees under (its consensus line).
NAME = "watch"
#: How long the watch's own group waits for a peer before it gives up
#: (the channel then stops, one line, and its group serves unwatched).
TIMEOUT_ENV = WATCH_TIMEOUT_ENV
DEFAULT_TIMEOUT_S = 600.0
#: How long the thread lets decisions gather before each drain (seconds).
GATHER_S = 0.01


def enabled() -> bool:
    """Whether ``SGLANG_ENABLE_RANK_CONSENSUS_CHECKER`` turns the watch on."""
    return switch(WATCH_ENV, meaning="the watch stays off")


def mode() -> str:
    """``exit`` or ``log`` (``SGLANG_DSPARK_DP_WATCH``; default ``exit``)."""
    return choice(WATCH_MODE_ENV, WATCH_MODES, default=EXIT)


@dataclasses.dataclass(frozen=True)
class Decision:
    """A watched decision: what the line calls it."""

    name: str


class Event(NamedTuple):
    """One decision one rank took: compared by ``(decision, step, key)``;
    ``shown`` is what the line prints of it (or what makes that text, when
    a line needs it: a per-step site formats nothing on the scheduler
    thread); ``changes`` the upstream changes
    (:mod:`sglang_dspark_dp.upstream` keys) it belongs to. A tuple: the
    scheduler thread builds several per step."""

    decision: str
    step: Any
    key: Any
    shown: str | Callable[[], str]
    changes: tuple[str, ...]

    def compared(self) -> tuple[Any, Any, Any]:
        return (self.decision, self.step, self.key)

    def text(self) -> str:
        return self.shown() if callable(self.shown) else self.shown

    def with_text(self) -> Event:
        """The event with its text made (what a gather can send)."""
        return Event(self.decision, self.step, self.key, self.text(), self.changes)


class Channel:
    """One decision group's watch: its dedicated gloo group, queue and
    thread (see the module)."""

    def __init__(self, ranks: tuple[int, ...], pg: Any, how: str) -> None:
        self.ranks = ranks
        self.pg = pg
        self.mode = how
        self.alarms: list[str] = []
        self.steps: dict[str, int] = {}
        self.stopped = ""
        self._reported: set[str] = set()
        self._parted: set[tuple[str, tuple[str, ...]]] = set()
        # deque.append is atomic and takes no lock: the scheduler thread's
        # whole cost of a decision; the thread polls every GATHER_S.
        self._queue: collections.deque[Any] = collections.deque()
        self._wake = threading.Event()
        self._stopping = False
        # SGLang's checker's intake for this group: None until known,
        # False where it does not compare over it.
        self._feed: Callable[[str], None] | bool | None = None
        self._thread = threading.Thread(
            target=self._drain,
            name=f"sglang-dspark-dp-watch-{'-'.join(map(str, ranks))}",
            daemon=True,
        )
        self._thread.start()

    # -- the scheduler thread ------------------------------------------

    def next_step(self, decision: str) -> int:
        """This rank's count of ``decision`` so far (its step)."""
        step = self.steps.get(decision, 0)
        self.steps[decision] = step + 1
        return step

    def note(self, event: Event) -> None:
        """Enqueue one decision (never waits); where SGLang's own checker
        is configured over exactly this group, hand it the event too."""
        self._queue.append((event, None))
        feed = self._feed
        if feed is None:
            feed = self._feed = _sglang_feeder(self.ranks)
        if feed:
            feed(sglang_text(event))

    def check_now(self, *events: Event) -> None:
        """Enqueue decisions and wait until the group has compared them
        (startup decisions, before the collective they lead to)."""
        done = threading.Event()
        for event in events[:-1]:
            self._queue.append((event, None))
        self._queue.append((events[-1], done))
        self._wake.set()
        while not done.wait(0.2):
            if not self._thread.is_alive():
                return

    def close(self, timeout_s: float = 10.0) -> None:
        """Compare what is queued, stop the thread, destroy the group."""
        self._stopping = True
        self._wake.set()
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            import torch.distributed as dist

            try:
                dist.destroy_process_group(self.pg)
            except Exception:
                pass

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the thread --------------------------------------------------------

    def _drain(self) -> None:
        try:
            while True:
                # Let a few steps' decisions gather: fewer, larger drains
                # (the thread takes the GIL from the scheduler less often);
                # a startup check or the stop wakes it at once.
                self._wake.wait(GATHER_S)
                self._wake.clear()
                queued = len(self._queue)
                if not queued:
                    if self._stopping:
                        return
                    continue
                # Lock-step: as many as every rank of the group has.
                batch = [self._queue.popleft() for _ in range(self._min_len(queued))]
                events = [event for event, _ in batch]
                if self._differ(events):
                    self._report(events)
                for _, done in batch:
                    if done is not None:
                        done.set()
        except Exception as exc:  # a peer gone, a group torn down
            self.stopped = f"{type(exc).__name__}: {exc}"
            logger.warning(
                "sglang-dspark-dp: watch: group %s stopped watching (%s); it "
                "serves unwatched from here",
                list(self.ranks),
                self.stopped.splitlines()[0][:300],
            )

    def _min_len(self, size: int) -> int:
        import torch
        import torch.distributed as dist

        t = torch.tensor([size], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.pg)
        return int(t.item())

    def _differ(self, events: list[Event]) -> bool:
        import torch
        import torch.distributed as dist

        digest = hashlib.sha1()
        for event in events:
            digest.update(repr(event.compared()).encode())
        # One collective: the maximum of each byte and of its complement
        # (255 - the minimum); equal digests leave them complementary.
        mine = list(digest.digest())
        both = torch.tensor(mine + [255 - b for b in mine], dtype=torch.int32)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.pg)
        n = len(mine)
        return not torch.equal(both[:n], 255 - both[n:])

    def _report(self, events: list[Event]) -> None:
        import torch.distributed as dist

        gathered: list[Any] = [None] * len(self.ranks)
        # The texts are made here, off the scheduler thread (and a text
        # made by a function would not pickle).
        shown = [event.with_text() for event in events]
        dist.all_gather_object(gathered, shown, group=self.pg)
        # Per step (of one site: the same changes), its first divergence
        # only, across drains: the later ones of that step follow from it
        # (the tier from the budget; no folded-sampling decision where
        # capture was skipped). Log mode names each decision's first
        # divergence once.
        for i in differences(gathered):
            event = gathered[0][i]
            where = (repr(event.step), event.changes)
            if where in self._parted:
                continue
            self._parted.add(where)
            if event.decision in self._reported:
                continue
            self._reported.add(event.decision)
            self._alarm(alarm_line(self.ranks, gathered, i))

    def _alarm(self, line: str) -> None:
        import torch.distributed as dist

        where = dump_flight_recorder(dist.get_rank())
        if where:
            line += f"; flight recorder dumped to {where}"
        if self.mode == EXIT:
            line += f"; ending the process ({WATCH_MODE_ENV}=exit)"
        else:
            line += f"; serving on ({WATCH_MODE_ENV}=log)"
        self.alarms.append(line)
        logger.critical("%s", line)
        for handler in [*logger.handlers, *logging.getLogger().handlers]:
            try:
                handler.flush()
            except Exception:
                pass
        if self.mode == EXIT:
            os._exit(1)


# --------------------------------------------------------------------------
# SGLang's own checker (0.5.19+).
# --------------------------------------------------------------------------


def _sglang_feeder(ranks: tuple[int, ...]) -> Callable[[str], None] | bool | None:
    """SGLang's checker's intake for ``ranks`` (see
    :func:`sglang_dspark_dp.adapter.checker.feeder`); False where this
    process has none or it compares over other groups; None while it is
    there but not configured yet (asked again at the next event)."""
    from sglang_dspark_dp.adapter import checker

    state = checker.configured()
    if state is None:
        return False
    if not state:
        return None
    return checker.feeder(ranks) or False


def sglang_text(event: Event) -> str:
    """An event as SGLang's checker logs it: the plugin, the decision, the
    step and the compared value (what every rank must say alike)."""
    return (
        f"sglang-dspark-dp: {event.decision} at {_step_text(event.step)}: "
        f"{event.key!r}"
    )


# --------------------------------------------------------------------------
# The line.
# --------------------------------------------------------------------------


def differences(gathered: list[list[Event]]) -> list[int]:
    """The indices of the events the ranks' batches differ on, in order."""
    return [
        i
        for i in range(min(len(batch) for batch in gathered))
        if len({repr(batch[i].compared()) for batch in gathered}) > 1
    ]


def alarm_line(ranks: tuple[int, ...], gathered: list[list[Event]], i: int) -> str:
    """The critical line for event ``i`` of the gathered batches."""
    mine = gathered[0][i]
    names = {batch[i].decision for batch in gathered}
    steps = {repr(batch[i].step) for batch in gathered}
    if len(names) == 1:
        what = f"the {mine.decision} decision"
    else:
        what = "the order of decisions (" + ", ".join(sorted(names)) + ")"
    step = _step_text(mine.step) if len(steps) == 1 else "steps that differ"
    values = "; ".join(
        f"rank {rank}: {_value_text(batch[i], len(names) > 1 or len(steps) > 1)}"
        for rank, batch in zip(ranks, gathered, strict=False)
    )
    changes: list[str] = []
    for batch in gathered:
        for key in batch[i].changes:
            if key not in changes:
                changes.append(key)
    return (
        f"sglang-dspark-dp: watch: ranks {list(ranks)} part ways on {what} at "
        f"{step}: {values}; {change_text(changes)}"
    )


def _step_text(step: Any) -> str:
    return f"step {step}" if isinstance(step, int) else str(step)


def _value_text(event: Event, full: bool) -> str:
    if full:
        return f"{event.decision} at {_step_text(event.step)}: {event.text()}"
    return event.text()


def _no_repairs() -> list[Any]:
    return []


#: Where the line finds the repairs (each with ``name``,
#: ``stands_in_for``, ``status()``): set by whoever turns the watch on
#: (:func:`tell_repairs`), so the watch imports no registry.
_repairs: Callable[[], list[Any]] = _no_repairs


def tell_repairs(source: Callable[[], list[Any]]) -> None:
    """Where the alarm line finds the repairs of this process."""
    global _repairs
    _repairs = source


def change_text(keys: list[str]) -> str:
    """Each upstream change, whether this build carries it (as the repairs'
    probes found) and whether a repair stands in for it in this process."""
    if not keys:
        return "no upstream change known for it"
    from sglang_dspark_dp import upstream

    try:
        repairs = list(_repairs())
    except Exception:
        repairs = []
    parts = []
    for key in keys:
        change = upstream.change(key)
        head = change.label if change.label == key else f"{change.label} {key}"
        state = ""
        standing: list[str] = []
        for repair in repairs:
            if key not in repair.stands_in_for:
                continue
            status = repair.status()
            for verdict in status.verdicts or repair.verdicts:
                if getattr(verdict, "key", None) == key and not state:
                    state = verdict.state.value
            standing.append(f"{repair.name}: {status.outcome.value}")
        enabled = [
            r.name
            for r in repairs
            if key in r.stands_in_for and r.status().enabled  # noqa: SIM102
        ]
        if enabled:
            stand = f"the {', '.join(enabled)} repair stands in for it here"
        elif standing:
            stand = f"no repair stands in for it here ({'; '.join(standing)})"
        else:
            stand = "no repair stands in for it"
        parts.append(f"{head} ({state + '; ' if state else ''}{stand})")
    return "upstream change " + ", ".join(parts)


def dump_flight_recorder(rank: int) -> str:
    """Where ``TORCH_FR_BUFFER_SIZE`` is set: this process's flight recorder
    dumped as ``TORCH_FR_DUMP_TEMP_FILE`` + rank (default: a
    ``fr_trace_rank_`` file in the temporary folder); its path, or empty."""
    from sglang_dspark_dp import flight_dump

    if not os.environ.get(flight_dump.BUFFER_ENV, "").strip():
        return ""
    prefix = os.environ.get(flight_dump.DUMP_ENV) or os.path.join(
        tempfile.gettempdir(), "sglang_dspark_dp_watch", flight_dump.PREFIX
    )
    try:
        return flight_dump.dump_to(f"{prefix}{rank}")
    except Exception as exc:
        return f"nowhere ({type(exc).__name__}: {exc})"


# --------------------------------------------------------------------------
# Channels, one per decision group.
# --------------------------------------------------------------------------

_channels: dict[tuple[int, ...], Channel | None] = {}
_lock = threading.Lock()


def can_watch() -> tuple[bool, str]:
    """Whether this rank can watch (``torch.distributed`` with gloo)."""
    try:
        import torch.distributed as dist
    except Exception as exc:
        return False, f"torch.distributed cannot be imported ({exc})"
    if not dist.is_available() or not dist.is_gloo_available():
        return False, "torch.distributed has no gloo backend here"
    return True, ""


def _timeout() -> datetime.timedelta:
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        seconds = float(raw) if raw else DEFAULT_TIMEOUT_S
        if not seconds > 0:
            raise ValueError
    except ValueError:
        logger.warning(
            "sglang-dspark-dp: %s=%r is not a positive number of seconds; %g s",
            TIMEOUT_ENV,
            raw,
            DEFAULT_TIMEOUT_S,
        )
        seconds = DEFAULT_TIMEOUT_S
    return datetime.timedelta(seconds=seconds)


def channel(group: Any) -> Channel | None:
    """The watch of ``group`` (a ``GroupCoordinator`` or anything with its
    ``world_size`` and ``cpu_group``), made on first use: the first call on
    a group is a collective every rank of it must make (the agreement, then
    the dedicated group). None: nothing to compare (one rank, no process
    group), or the group serves unwatched."""
    from sglang_dspark_dp.consensus import GroupVerdict
    from sglang_dspark_dp.isolation import is_probing, is_process_group

    size = getattr(group, "world_size", None)
    cpu_group = getattr(group, "cpu_group", None)
    if not isinstance(size, int) or size <= 1 or is_probing():
        return None
    if not is_process_group(cpu_group):
        return None
    import torch.distributed as dist

    ranks = tuple(int(r) for r in dist.get_process_group_ranks(cpu_group))
    with _lock:
        if ranks in _channels:
            return _channels[ranks]
        ok, why = can_watch()
        verdict = GroupVerdict(
            NAME,
            ok,
            why,
            consequence="serves unwatched",
            what="watch",
        )
        made: Channel | None = None
        if verdict.agree(cpu_group, size):
            try:
                pg = dist.new_group(
                    list(ranks),
                    backend="gloo",
                    timeout=_timeout(),
                    use_local_synchronization=True,
                )
                made = Channel(ranks, pg, mode())
                logger.info(
                    "sglang-dspark-dp: watch: watching ranks %s (on a mismatch: %s)",
                    list(ranks),
                    "log and end the process" if made.mode == EXIT else "log",
                )
            except Exception as exc:
                logger.warning(
                    "sglang-dspark-dp: watch: group %s cannot be watched (its own "
                    "gloo group failed: %s: %s); it serves unwatched",
                    list(ranks),
                    type(exc).__name__,
                    exc,
                )
        _channels[ranks] = made
        return made


def channels() -> list[Channel]:
    return [c for c in _channels.values() if c is not None]


def alarms() -> list[str]:
    """Every alarm line this process logged (``log`` mode; ``exit`` ends
    the process at the first)."""
    return [line for c in channels() for line in c.alarms]


def shutdown(timeout_s: float = 10.0) -> list[str]:
    """Compare what is queued, stop every channel and forget them; every
    alarm line they logged."""
    with _lock:
        found = channels()
        _channels.clear()
    for c in found:
        c.close(timeout_s)
    return [line for c in found for line in c.alarms]


def threads() -> list[threading.Thread]:
    """The watch's threads alive in this process."""
    return [
        t for t in threading.enumerate() if t.name.startswith("sglang-dspark-dp-watch-")
    ]
