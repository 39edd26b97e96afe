"""Seeded request churn, one request set per DP rank.

Every rank runs the same phase plan (derived from the seed alone, so all
ranks agree on it without talking) and its own random stream (seed, rank)
for arrivals, lengths and finishes. The phases cover what has broken DP
lockstep in production:

* ``steady``     random arrivals and finishes on every rank;
* ``all_idle``   every rank drains to zero (all-idle steps);
* ``single``     one rank busy, the others idle;
* ``staggered``  no arrivals, ranks finish their requests at different times;
* ``burst``      arrivals push counts past the largest graph size;
* ``repro``      the reported reproduction: 16 mixed prompts at client
                 concurrency 4, spread over the DP ranks.
"""

from __future__ import annotations

import dataclasses
import random

from sglang_dspark_dp.drivers import MAX_CAPTURE_BS

PHASES = ("steady", "all_idle", "single", "staggered", "burst", "repro")
MAX_RUNNING = 200


@dataclasses.dataclass(frozen=True)
class Phase:
    kind: str
    start: int
    end: int  # exclusive
    busy_rank: int = 0


def phase_plan(seed: int, steps: int, dp: int) -> list[Phase]:
    """The phases of a run: every kind appears (given enough steps), in a
    seeded order, each 15-90 steps long."""
    rng = random.Random(f"plan:{seed}:{dp}")
    plan: list[Phase] = []
    t = 0
    while t < steps:
        kinds = list(PHASES)
        rng.shuffle(kinds)
        for kind in kinds:
            if t >= steps:
                break
            length = rng.randint(15, 90)
            plan.append(Phase(kind, t, min(t + length, steps), rng.randrange(dp)))
            t += length
    return plan


def _repro_schedule(
    seed: int, phase_index: int, dp: int, length: int
) -> list[list[int]]:
    """Per-step running counts of every rank for the repro phase: 16 prompts
    of mixed output lengths, at most 4 in flight, each new prompt routed to
    the DP rank with the fewest running requests (ties: lowest rank)."""
    rng = random.Random(f"repro:{seed}:{phase_index}")
    pending = [rng.choice((3, 7, 12, 25, 40, 64)) for _ in range(16)]
    running: list[list[int]] = [[] for _ in range(dp)]
    out: list[list[int]] = []
    for _ in range(length):
        for r in range(dp):
            running[r] = [n - 1 for n in running[r] if n > 1]
        while pending and sum(len(x) for x in running) < 4:
            target = min(range(dp), key=lambda r: (len(running[r]), r))
            running[target].append(pending.pop(0))
        out.append([len(x) for x in running])
    return out


class RankChurn:
    """The request set of one DP rank."""

    def __init__(self, *, seed: int, rank: int, dp: int, steps: int) -> None:
        self.rank = rank
        self.dp = dp
        self.plan = phase_plan(seed, steps, dp)
        self._seed = seed
        self._rng = random.Random(f"rank:{seed}:{rank}")
        self._running: list[int] = []  # remaining decode steps per request
        self._phase_i = -1
        self._repro: list[list[int]] = []

    def _phase(self, t: int) -> tuple[int, Phase]:
        for i, ph in enumerate(self.plan):
            if ph.start <= t < ph.end:
                return i, ph
        raise IndexError(f"step {t} is past the plan")

    def _arrive(self, lo: int, hi: int, max_len: int, cap: int) -> None:
        for _ in range(self._rng.randint(lo, hi)):
            if len(self._running) >= cap:
                break
            self._running.append(self._rng.randint(1, max_len))

    def count(self, t: int) -> int:
        """This rank's running requests at decode step ``t`` (call with
        t = 0, 1, 2, ... in order)."""
        i, ph = self._phase(t)
        entering = i != self._phase_i
        self._phase_i = i
        # finishes: every running request decodes one token
        self._running = [n - 1 for n in self._running if n > 1]
        kind = ph.kind
        if kind == "repro":
            if entering:
                self._running = []
                self._repro = _repro_schedule(self._seed, i, self.dp, ph.end - ph.start)
            return self._repro[t - ph.start][self.rank]
        if kind == "all_idle" or (kind == "single" and self.rank != ph.busy_rank):
            self._running = []
        elif kind == "single" or kind == "steady":
            if self._rng.random() < 0.6:
                self._arrive(0, 4, 40, 100)
        elif kind == "staggered":
            if entering:
                self._running = [
                    self._rng.randint(1, 30) for _ in range(self._rng.randint(1, 8))
                ]
        elif kind == "burst":
            if entering:
                self._cap = self._rng.randint(MAX_CAPTURE_BS + 1, MAX_RUNNING)
            self._arrive(8, 30, 120, self._cap)
        return len(self._running)
