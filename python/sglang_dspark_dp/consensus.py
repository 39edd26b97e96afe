"""A repair that adds a collective is on for every rank of its group or for
none: the ranks agree on it before its first use.

A repair whose hook enters a collective (the startup reading's reduction,
the verify budget's broadcast) would hang a server if one rank of the group
ran it and another did not. Its verdict comes from a probe that is the same
on every rank when the ranks run the same code with the same environment
(they do: one server, one Python), but a probe can also fail for a reason
that is not (an exception from a transient condition). So such a repair is
hooked on every rank where its target exists, carrying its local verdict,
and at the first use on a group the ranks all-reduce the verdicts (the
minimum, one int over the group's CPU group): if any rank's probe failed,
every rank of the group runs stock from then on, together, and says so in
one line; otherwise every rank runs the repair. The answer is kept per
group, so the agreement costs one small collective per group and process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from sglang_dspark_dp.isolation import is_probing, is_process_group

logger = logging.getLogger("sglang_dspark_dp")


class GroupVerdict:
    """This rank's verdict for one repair, and the group's agreed one."""

    def __init__(
        self,
        repair: str,
        ok: bool,
        why: str = "",
        *,
        consequence: str = "runs stock SGLang here",
        what: str = "probe",
    ) -> None:
        #: What failed on a rank whose verdict is not ok (its line).
        self.what = what
        self.repair = repair
        #: What every rank of the group does when one rank's verdict fails.
        self.consequence = consequence
        self.ok = bool(ok)
        self.why = why
        self._agreed: dict[int, bool] = {}
        self._lock = threading.Lock()

    def agree(self, cpu_group: Any, world_size: int) -> bool:
        """Whether every rank of the group runs the repair (the first call on
        a group is a collective every rank of it must make). Inside a probe,
        or where ``cpu_group`` is not a real process group of this process
        (a stand-in's token, a single-process tool), there is nobody to
        agree with: the local verdict stands, whatever state
        ``torch.distributed`` is in."""
        if world_size <= 1 or is_probing() or not is_process_group(cpu_group):
            return self.ok
        key = id(cpu_group)
        with self._lock:
            if key not in self._agreed:
                self._agreed[key] = self._all_ok(cpu_group)
                if not self._agreed[key]:
                    logger.warning(
                        "sglang-dspark-dp: %s: %s; every rank of its group of %d %s",
                        self.repair,
                        f"this rank's {self.what} failed ({self.why})"
                        if not self.ok
                        else f"another rank's {self.what} failed",
                        world_size,
                        self.consequence,
                    )
            return self._agreed[key]

    def _all_ok(self, cpu_group: Any) -> bool:
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1 if self.ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=cpu_group)
        return bool(flag.item())
