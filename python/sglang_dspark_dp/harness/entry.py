"""The worker's step entry on every rank: the scheduler's non-overlap call
reaching ``DSparkWorkerV2.forward_batch_generation``, one process per rank.

Each rank joins a gloo world over loopback, builds its TP groups (SGLang's
``GroupCoordinator`` where the release lets it, ``groups`` TP groups of
``tp`` ranks side by side) and runs the installed ``Scheduler.run_batch``
with the overlap schedule off (:mod:`sglang_dspark_dp.drivers.scheduler`)
for a prefill step and then decode steps, up to the installed worker
method. The stand-in worker carries the rank's TP group where the worker
keeps its draft runner's, so the watch's ``worker-entry`` site finds the
group its ranks must agree over.

``fix``: the non-overlap-entry repair instrumented in every rank except
those in ``unrepaired`` (a repair that could not apply on one rank);
otherwise stock. ``watch``: the watch on in that mode. Each rank reports
what every step did, its watch's alarms and how many entries it watched.
"""

from __future__ import annotations

import dataclasses
import traceback
from types import SimpleNamespace
from typing import Any

from sglang_dspark_dp.harness import groups, world
from sglang_dspark_dp.harness.lockstep import CannotRun, free_port
from sglang_dspark_dp.harness.ranks import check_groups, check_timing, run_ranks

MAX_WORLD = 8
REPAIR = "non-overlap-entry"


@dataclasses.dataclass(frozen=True)
class EntryConfig:
    tp: int = 2
    groups: int = 2
    decode_steps: int = 3
    fix: bool = True
    unrepaired: tuple[int, ...] = ()
    watch: str | None = "log"
    timeout_s: float = 60.0
    hang_s: float = 20.0
    port: int = 0

    @property
    def world(self) -> int:
        return self.tp * self.groups

    def check(self) -> None:
        if not isinstance(self.tp, int) or isinstance(self.tp, bool) or self.tp < 1:
            raise CannotRun(f"tp must be a positive integer, got {self.tp!r}")
        check_groups(self, MAX_WORLD, CannotRun)
        check_timing(self, CannotRun)
        steps = self.decode_steps
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise CannotRun(
                f"decode_steps must be a non-negative integer, got {steps!r}"
            )
        bad = [r for r in self.unrepaired if r not in range(self.world)]
        if bad:
            raise CannotRun(
                f"unrepaired must name ranks 0-{self.world - 1}, got {bad!r}"
            )
        if self.watch not in (None, "log", "exit"):
            raise CannotRun(f"watch must be None, 'log' or 'exit', got {self.watch!r}")


@dataclasses.dataclass(frozen=True)
class EntryResult:
    reports: dict[int, dict[str, Any]]

    def alarms(self) -> list[str]:
        return [a for r in sorted(self.reports) for a in self.reports[r]["alarms"]]

    def errors(self) -> dict[int, str]:
        return {r: rep["error"] for r, rep in self.reports.items() if rep["error"]}


def _rank_body(rank: int, cfg: EntryConfig, port: int) -> dict[str, Any]:
    steps: list[dict[str, Any]] = []
    error = ""
    watched: dict[str, int] = {}
    try:
        _rank_run(rank, cfg, port, steps, watched)
    except Exception as exc:
        error = "".join(traceback.format_exception(exc))[-2000:]
    alarms = world.watch_off() if cfg.watch is not None else []
    return {"steps": steps, "error": error, "alarms": alarms, "watched": watched}


def _rank_failed(rank: int, why: str) -> dict[str, Any]:
    return {"steps": [], "error": why, "alarms": [], "watched": {}}


def _rank_run(
    rank: int,
    cfg: EntryConfig,
    port: int,
    steps: list[dict[str, Any]],
    watched: dict[str, int],
) -> None:
    import torch

    from sglang_dspark_dp import adapter, registry, watch, watch_sites
    from sglang_dspark_dp.adapter.scheduler import load_scheduler
    from sglang_dspark_dp.adapter.worker import STEP_GROUP_SOURCE
    from sglang_dspark_dp.drivers.scheduler import StandInWorker, non_overlap_step

    torch.set_num_threads(1)
    repair = registry.repair(REPAIR)
    # As a server process starts: nothing hooked, then its own probes.
    repair.uninstrument()
    if cfg.fix and rank not in cfg.unrepaired:
        repair.instrument(apply=True)
    if cfg.watch is not None:
        world.watch_on(cfg.watch)
    world.join(rank, cfg.world, port, cfg.timeout_s)
    group, _ = world.verify_group(
        rank, world.Layout(tp=cfg.tp, groups=cfg.groups), hang_s=cfg.hang_s
    )
    api = adapter.load_sglang_api()
    module, cls = load_scheduler()
    _, worker_cls = adapter.load_worker()
    worker = StandInWorker()
    owner, _, attr = STEP_GROUP_SOURCE.rpartition(".")
    setattr(worker, owner, SimpleNamespace(**{attr: group}))
    for i in range(1 + cfg.decode_steps):
        out = non_overlap_step(
            api, module, cls, worker_cls, prefill=i == 0, worker=worker
        )
        steps.append(dataclasses.asdict(out))
    for ch in watch.channels():
        watched[",".join(map(str, ch.ranks))] = ch.steps.get(watch_sites.ENTRY, 0)
    watched["group"] = groups.kind(group)  # type: ignore[assignment]


def run_entry(cfg: EntryConfig) -> EntryResult:
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.adapter.scheduler import load_scheduler

    cfg.check()
    port = free_port(cfg.port)
    # Imported once here, so the forked ranks start with SGLang loaded.
    adapter.load_sglang_api()
    load_scheduler()
    adapter.load_worker()
    if cfg.watch is not None:
        from sglang_dspark_dp import watch_sites

        watch_sites.load_site_modules()

    def body(rank: int) -> dict[str, Any]:
        return _rank_body(rank, cfg, port)

    return EntryResult(
        run_ranks(cfg.world, body, _rank_failed, timeout_s=cfg.timeout_s)
    )
