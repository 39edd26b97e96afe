"""Shared by the adapter's modules: finding a DSpark class, reading a
signature, swapping attributes for a ``with`` block, and the page-locked
host memory an asynchronous copy to the device needs."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from sglang_dspark_dp.outcome import DidNotEnable


def dspark_class(module_name: str, cls_name: str, what: str) -> tuple[Any, type]:
    """``(module, class)`` of a DSpark component, or DidNotEnable saying
    which is missing."""
    try:
        importlib.import_module("sglang")
    except ImportError as exc:
        raise DidNotEnable(f"sglang is not importable ({exc})") from exc
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise DidNotEnable(
            f"the installed SGLang has no DSpark {what} module {module_name} ({exc})"
        ) from exc
    cls = getattr(module, cls_name, None)
    if not isinstance(cls, type):
        raise DidNotEnable(f"{module_name} has no class {cls_name}")
    return module, cls


_MISSING = object()


class AttrSwap:
    """Set ``(obj, name, value)`` attributes for a ``with`` block and put
    back exactly what was there (an attribute that was absent from the
    object's own ``__dict__`` is deleted again, so an instance override
    never leaves a stale bound method behind)."""

    def __init__(self, *swaps: tuple[Any, str, Any]) -> None:
        self._swaps = swaps
        self._saved: list[tuple[Any, str, Any]] = []

    def __enter__(self) -> AttrSwap:
        for obj, name, value in self._swaps:
            self._saved.append((obj, name, vars(obj).get(name, _MISSING)))
            setattr(obj, name, value)
        return self

    def __exit__(self, *exc: Any) -> None:
        while self._saved:
            obj, name, old = self._saved.pop()
            if old is _MISSING:
                try:
                    delattr(obj, name)
                except AttributeError:
                    pass
            else:
                setattr(obj, name, old)


def signature_of(fn: Any) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):
        return None


def pins_host_memory(device: Any) -> bool:
    """Whether a host buffer that feeds ``device`` by asynchronous copies
    must be pinned: a CUDA device copies from pageable memory only after
    the host has waited for it, so a non-blocking copy would block."""
    return getattr(device, "type", None) == "cuda"


def host_buffer(numel: int, dtype: Any, *, pinned: bool) -> Any:
    """A zeroed host tensor of ``numel`` elements, in page-locked memory
    when ``pinned`` (torch's ``pin_memory``, which needs a CUDA driver)."""
    import torch

    return torch.zeros(numel, dtype=dtype, pin_memory=pinned)


def is_pinned(tensor: Any) -> bool:
    """Whether ``tensor``'s memory is page-locked (``Tensor.is_pinned()``)."""
    return bool(tensor.is_pinned())


def current_stream(device: Any) -> Any:
    """The stream work for ``device`` is queued on now (CUDA's current
    stream of that device), where an event recorded after a copy goes."""
    import torch

    return torch.cuda.current_stream(device)
