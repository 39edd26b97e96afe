"""Process-state harness: does the plugin decide the same in a process that
already runs ``torch.distributed``?

A server loads plugins before it initialises ``torch.distributed``, but an
``Engine`` built inside an RL or evaluation job loads them in whatever
process builds it. Here ``dp`` ranks (one process each, gloo over loopback)
join their group first and then load the plugin through SGLang's
``load_plugins()``, under DP attention with one rank short of memory (the
startup harness, ``after_init``); a fresh process (nothing initialised)
loads it too. Every rank must report each repair's outcome and reason
exactly as the fresh process does, and the ranks must still agree on draft
CUDA-graph capture.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sglang_dspark_dp.harness import startup
from sglang_dspark_dp.harness.lockstep import CannotRun
from sglang_dspark_dp.harness.ranks import run_ranks


def _fresh(rank: int) -> dict[str, Any]:
    from sglang_dspark_dp import adapter, registry

    registry.uninstrument()  # whatever the parent held: a server's start
    adapter.forget_loaded_plugins()
    adapter.load_plugins()
    return {
        "statuses": [
            {"repair": st.repair, "outcome": st.outcome.value, "reason": st.reason}
            for st in registry.status()
        ]
    }


def _failed(rank: int, why: str) -> dict[str, Any]:
    return {"error": why}


@dataclasses.dataclass
class ProcessStateResult:
    dp: int
    #: Each repair's ``{repair, outcome, reason}`` in a fresh process.
    fresh: list[dict[str, str]]
    startup: startup.StartupResult
    #: Rank -> its repairs' statuses, loaded after the group was up.
    ranks: dict[int, list[dict[str, str]]]

    @property
    def differences(self) -> list[str]:
        """Where a rank's verdicts differ from the fresh process's."""
        want = {s["repair"]: s for s in self.fresh}
        out = []
        for rank in range(self.dp):
            got = {s["repair"]: s for s in self.ranks.get(rank, [])}
            for name in sorted(set(want) | set(got)):
                a, b = want.get(name), got.get(name)
                if (
                    a is None
                    or b is None
                    or (a["outcome"], a["reason"])
                    != (
                        b["outcome"],
                        b["reason"],
                    )
                ):
                    out.append(
                        f"rank {rank}: {name}: "
                        + (f"{b['outcome']}: {b['reason']}" if b else "no status")
                        + " (fresh process: "
                        + (f"{a['outcome']}: {a['reason']}" if a else "no status")
                        + ")"
                    )
        return out

    @property
    def ok(self) -> bool:
        return not self.differences and self.startup.correct

    def summary(self) -> str:
        head = f"plugin loaded after torch.distributed init on {self.dp} ranks (gloo): "
        if self.differences:
            verdicts = (
                f"{len(self.differences)} verdicts differ from a fresh process's "
                f"(first: {self.differences[0]})"
            )
        else:
            verdicts = (
                f"every rank's {len(self.fresh)} repair verdicts match a fresh "
                "process's"
            )
        return f"{head}{verdicts}; startup: {self.startup.summary()}"


def run(*, dp: int, timeout_s: float = 60.0) -> ProcessStateResult:
    """Load the plugin in a fresh process and, after joining a gloo group,
    in each of ``dp`` ranks under DP attention; raises :class:`CannotRun`
    for bad input."""
    fresh = run_ranks(1, _fresh, _failed, timeout_s=timeout_s).get(0)
    if fresh is None or "error" in fresh:
        why = "no report" if fresh is None else fresh["error"].splitlines()[-1]
        raise CannotRun(f"the fresh process could not load the plugin: {why}")
    result = startup.run_startup(
        startup.StartupConfig(
            tp=dp, dp=dp, fix=True, after_init=True, timeout_s=timeout_s
        )
    )
    return ProcessStateResult(
        dp=dp,
        fresh=fresh["statuses"],
        startup=result,
        ranks={r.rank: list(r.statuses) for r in result.ranks},
    )
