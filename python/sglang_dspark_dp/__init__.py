"""SGLang plugin that makes DSpark's DP/TP ranks take the same control-plane
decisions: it repairs what the installed release gets wrong, and only that.

The face: ``instrument()``, ``uninstrument()``, ``status()`` (every repair's
:class:`~sglang_dspark_dp.outcome.Status`) and ``DidNotEnable``, all loaded
lazily, so importing this package never imports SGLang or torch.
"""

from __future__ import annotations

from sglang_dspark_dp.outcome import DidNotEnable, Status
from sglang_dspark_dp.package import __version__

__all__ = [
    "DidNotEnable",
    "Status",
    "__version__",
    "instrument",
    "status",
    "uninstrument",
]


def instrument(*, apply: bool = True) -> list[Status]:
    """Instrument every repair the installed SGLang needs; one status each."""
    from sglang_dspark_dp import registry

    return registry.instrument(apply=apply)


def uninstrument() -> None:
    """Undo :func:`instrument` for every repair."""
    from sglang_dspark_dp import registry

    registry.uninstrument()


def status() -> list[Status]:
    """Every repair's current :class:`Status`."""
    from sglang_dspark_dp import registry

    return registry.status()
