"""Process groups of simulated ranks, laid out as a real server lays them
out: several groups side by side, most not starting at rank 0.

:func:`partition` cuts ``world`` ranks into consecutive groups of ``size``
(``[[0, 1], [2, 3]]``); :func:`make_group` gives this rank its group of a
partition, as SGLang's own ``GroupCoordinator`` on gloo where the installed
release lets it be built that way, else as :class:`PlainGroup` (the same
attributes, over a gloo group of its own). Every rank calls
:func:`make_group` for every partition, in the same order (collective
group creation). The group's CPU group has ``timeout``: a barrier or a
collective a peer never enters fails there instead of hanging.
"""

from __future__ import annotations

import datetime
from typing import Any


def partition(world: int, size: int) -> list[list[int]]:
    """``world`` ranks as consecutive groups of ``size``."""
    if size <= 0 or world % size:
        raise ValueError(f"cannot cut {world} ranks into groups of {size}")
    return [list(range(g, g + size)) for g in range(0, world, size)]


def group_of(groups: list[list[int]], rank: int) -> list[int]:
    for ranks in groups:
        if rank in ranks:
            return ranks
    raise ValueError(f"rank {rank} is in none of {groups}")


class PlainGroup:
    """A group's size, this rank's place in it, its gloo ``cpu_group`` (also
    its device group), a barrier and a broadcast over it, as SGLang's
    ``GroupCoordinator`` has them."""

    def __init__(self, ranks: list[int], rank: int, pg: Any) -> None:
        self.ranks = list(ranks)
        self.world_size = len(ranks)
        self.rank_in_group = self.ranks.index(rank)
        self.first_rank = self.ranks[0]
        self.cpu_group = pg
        self.device_group = pg

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.cpu_group)

    def broadcast(self, tensor: Any, src: int = 0) -> Any:
        import torch.distributed as dist

        if self.world_size > 1:
            dist.broadcast(tensor, src=self.ranks[src], group=self.cpu_group)
        return tensor

    def __repr__(self) -> str:
        return f"PlainGroup(ranks={self.ranks})"


def make_group(
    groups: list[list[int]],
    rank: int,
    *,
    name: str,
    timeout_s: float,
    coordinator: bool = True,
) -> Any:
    """This rank's group among ``groups`` (see the module)."""
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if coordinator:
        from sglang_dspark_dp.adapter import group_coordinator

        built = group_coordinator(groups, local_rank=rank, name=name, timeout=timeout)
        if built is not None:
            return built
    mine = None
    for ranks in groups:
        pg = dist.new_group(ranks, timeout=timeout)
        if rank in ranks:
            mine = PlainGroup(ranks, rank, pg)
    assert mine is not None, (rank, groups)
    return mine


def kind(group: Any) -> str:
    """``GroupCoordinator`` or ``PlainGroup``: which one a harness ran on."""
    return type(group).__name__
