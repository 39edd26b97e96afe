"""SGLang's own rank consensus checker (``sglang.srt.utils.rank_consensus_checker``,
0.5.19+): whether it is configured, which rank sets its dedicated groups
span, and handing it one event.

Its public face is ``enabled()``, ``configure(groups)`` and
``assert_same(fmt, *args)``; which groups it compares over and which thread
may enqueue are module state (read here and nowhere else). The module is
looked up in ``sys.modules`` only: the scheduler imports it where the
release has it, and a process that never did has no checker to feed.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import Any

CHECKER_MODULE = "sglang.srt.utils.rank_consensus_checker"
#: The checker's dedicated groups and the thread ``assert_same`` accepts.
SYNC_GROUPS = "_sync_groups"
SCHEDULER_THREAD = "_scheduler_thread"


def loaded() -> Any:
    """The checker module if this process imported it, else None."""
    return sys.modules.get(CHECKER_MODULE)


def configured() -> bool | None:
    """Whether SGLang's checker is configured in this process: None where
    this process has no checker (a release before 0.5.19, or never
    imported), False where it is there but not (yet) configured."""
    module = loaded()
    if module is None:
        return None
    fn = getattr(module, "enabled", None)
    try:
        return bool(fn()) if callable(fn) else None
    except Exception:
        return None


def rank_sets() -> set[tuple[int, ...]]:
    """The rank sets the configured checker compares over (empty: none)."""
    import torch.distributed as dist

    module = loaded()
    out: set[tuple[int, ...]] = set()
    for pg in getattr(module, SYNC_GROUPS, None) or ():
        try:
            out.add(tuple(int(r) for r in dist.get_process_group_ranks(pg)))
        except Exception:
            continue
    return out


def feeder(ranks: tuple[int, ...]) -> Callable[[str], None] | None:
    """Where the checker is configured and compares over exactly ``ranks``
    (one group: its drain reduces over all of its groups, so an event only
    some of them take would be a false divergence), a function that hands
    it one event text, from the thread the checker accepts (elsewhere it
    drops the event, as ``assert_same`` would refuse it); else None."""
    module = loaded()
    if module is None or rank_sets() != {tuple(ranks)}:
        return None
    assert_same = module.assert_same

    def feed(text: str) -> None:
        if threading.current_thread() is getattr(module, SCHEDULER_THREAD, None):
            assert_same("%s", text)

    return feed


def load() -> Any:
    """Import SGLang's checker (ImportError: this release has none)."""
    import importlib

    return importlib.import_module(CHECKER_MODULE)


def configure(groups: list[Any]) -> None:
    """SGLang's own ``configure`` on ``groups`` (``GroupCoordinator``s),
    from the thread that will take the decisions, as the scheduler calls it
    at the end of its ``__init__``; a no-op unless SGLang's switch is on."""
    load().configure(groups)


def shutdown() -> None:
    """SGLang's own ``shutdown``: what is queued compared, the thread stopped."""
    module = loaded()
    if module is not None:
        module.shutdown()
