"""A probe's answer never depends on the process that asks.

Every repair decides by driving the installed SGLang on stand-ins (a group
token, a replaying group, a CPU runner). The process that loads the plugin
may already run ``torch.distributed`` (an RL or evaluation job that builds
an ``Engine``), may see no GPU, or may have a default device set. None of
that may reach a probe:

* :func:`probing` marks the probe's extent: tensors made without a device
  go to the CPU whatever default device the process set, and no agreement
  (:mod:`sglang_dspark_dp.consensus`) communicates while it is active;
* :func:`is_process_group` tells a real ``torch.distributed`` process group
  from a stand-in's token, so a collective is only ever entered on a group
  that exists.

:func:`isolated` is the decorator form for a probe function.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

_PROBING = contextvars.ContextVar("sglang_dspark_dp_probing", default=False)

F = TypeVar("F", bound=Callable[..., Any])


def is_probing() -> bool:
    """Whether the caller runs inside a probe (:func:`probing`)."""
    return _PROBING.get()


@contextlib.contextmanager
def probing() -> Iterator[None]:
    """For a ``with`` block: a probe. Tensors made without a device are
    made on the CPU, and no agreement communicates."""
    import torch

    token = _PROBING.set(True)
    try:
        with torch.device("cpu"):
            yield
    finally:
        _PROBING.reset(token)


def isolated(fn: F) -> F:
    """``fn`` always runs as a probe (:func:`probing`)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        with probing():
            return fn(*args, **kwargs)

    return run  # type: ignore[return-value]


def is_process_group(group: Any) -> bool:
    """Whether ``group`` is a real ``torch.distributed`` process group of
    this process (not a stand-in's token, not None)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return isinstance(group, dist.ProcessGroup)
