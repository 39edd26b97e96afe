"""A simulated server's world, set up once for every harness: joining the
gloo group over loopback, and the groups a DSpark server lays out.

Every harness (lockstep, startup, compact verify, diverge) starts its ranks
the same way: one process per rank joins a ``torch.distributed`` gloo group
on ``127.0.0.1`` (:func:`join`), then builds the groups its code reads, as
SGLang lays them out (:mod:`sglang_dspark_dp.harness.groups`):

* :class:`Layout` says which: ``tp`` ranks per TP group, ``groups`` TP
  groups side by side, DP attention of ``dp`` ranks per TP group (attention
  TP ``tp // dp``) and whether the draft is dense (its graphs then capture
  on the attention-TP group);
* :func:`startup_groups` builds the three groups the worker's startup reads:
  the capture group, the draft model runner's TP group and the group
  ``SpecTpSync`` is built on;
* :func:`verify_group` builds this rank's TP group for the verify planner.

Every rank calls each builder for the whole world, in the same order
(collective group creation).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import sys
from typing import Any

from sglang_dspark_dp.harness import groups


def join(rank: int, world: int, port: int, timeout_s: float) -> None:
    """This rank joins the world's gloo group on loopback ``port``; every
    collective on it (and on groups made without their own timeout) fails
    after ``timeout_s`` instead of hanging."""
    import torch.distributed as dist

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a server lays its ranks out (see the module)."""

    tp: int
    dp: int = 1
    groups: int = 1
    dense_draft: bool = False

    @property
    def world(self) -> int:
        return self.tp * self.groups

    @property
    def attn_tp(self) -> int:
        return self.tp // self.dp

    @property
    def dp_attention(self) -> bool:
        return self.dp > 1

    def capture_size(self) -> int:
        """Ranks per capture group."""
        return self.attn_tp if self.dense_draft else self.tp

    def capture_groups(self) -> list[list[int]]:
        return groups.partition(self.world, self.capture_size())

    def tp_groups(self) -> list[list[int]]:
        return groups.partition(self.world, self.tp)

    def dp_rank(self, rank: int) -> int:
        """This rank's DP rank within its TP group (0 without DP attention)."""
        return (rank % self.tp) // self.attn_tp if self.dp_attention else 0


def startup_groups(
    rank: int, layout: Layout, *, hang_s: float, coordinator: bool = True
) -> tuple[Any, Any, Any]:
    """``(capture group, the draft model runner's TP group, the group
    SpecTpSync is built on)``: the TP group everywhere under plain TP; under
    DP attention ``SpecTpSync`` gets the attention-TP group (one rank each
    with attention TP 1: nothing to communicate over), and a dense draft
    captures on it too."""
    tp = groups.make_group(
        layout.tp_groups(), rank, name="tp", timeout_s=hang_s, coordinator=coordinator
    )
    if not layout.dp_attention:
        return tp, tp, tp
    attn_layout = groups.partition(layout.world, layout.attn_tp)
    if layout.attn_tp > 1:
        attn = groups.make_group(
            attn_layout, rank, name="attn_tp", timeout_s=hang_s, coordinator=coordinator
        )
    else:
        attn = groups.PlainGroup(groups.group_of(attn_layout, rank), rank, None)
    if layout.dense_draft:
        return attn, tp, attn
    return tp, tp, attn


def verify_group(
    rank: int, layout: Layout, *, hang_s: float, coordinator: bool = True
) -> tuple[Any, int]:
    """This rank's TP group (the verify planner's) and its index among the
    world's TP groups."""
    layout_groups = layout.tp_groups()
    group = groups.make_group(
        layout_groups, rank, name="tp", timeout_s=hang_s, coordinator=coordinator
    )
    return group, layout_groups.index(groups.group_of(layout_groups, rank))


def watch_on(how: str, *, fails: bool = False) -> list[str]:
    """This rank's watch on in ``how`` mode (``exit``/``log``), its sites
    hooked outside whatever repairs the rank instrumented, as a server's
    arming does; the sites hooked. ``fails``: this rank cannot watch (a
    fault injected in this process only)."""
    from sglang_dspark_dp import registry, settings, watch, watch_sites

    if fails:
        watch.can_watch = lambda: (False, "fault injected on this rank")
    # The rank's lines reach its stderr, as a server's configured logging
    # shows them (whatever handlers the parent left on the root logger).
    logger = logging.getLogger("sglang_dspark_dp")
    logger.handlers = [logging.StreamHandler(sys.stderr)]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    watch.tell_repairs(registry.repairs)
    os.environ[settings.WATCH_ENV] = "1"
    os.environ[settings.WATCH_MODE_ENV] = how
    watch_sites.load_site_modules()
    return watch_sites.instrument(apply=True)


def sglang_checker_on(groups_: list[Any], log_path: str) -> None:
    """SGLang's own rank consensus checker configured on ``groups_`` from
    this thread, as the scheduler configures it, its lines (every level)
    written to ``log_path`` as it logs them (ImportError where the
    installed release has no checker)."""
    from sglang_dspark_dp.adapter import checker

    module = checker.load()
    log = logging.getLogger(module.__name__)
    handler = logging.FileHandler(log_path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    checker.configure(groups_)


def sglang_checker_off() -> None:
    """SGLang's checker stopped (what it holds compared first)."""
    from sglang_dspark_dp.adapter import checker

    checker.shutdown()


def watch_off() -> list[str]:
    """Compare what this rank's watch still holds, stop it; its alarms."""
    from sglang_dspark_dp import watch

    return watch.shutdown()
