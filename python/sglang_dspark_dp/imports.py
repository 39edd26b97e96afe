"""Post-import hooks: run a callback when a module is first imported, once
the import that brought it in has settled.

As wrapt's ``register_post_import_hook`` (which OpenTelemetry's
instrumentations use to defer their patching), :func:`when_imported` runs
its callback at once if the module is already imported, and otherwise right
after the module is first imported, in the process and thread that import
it; a process that never imports it never runs it.

A repair's callback does more than wrap a function: it probes the installed
code, which imports its neighbours. A module imported at the top of another
module (DSpark's draft module at the top of its worker's) is loaded while
that other module is still half made, so the callbacks of every module in
one import chain wait until the outermost module of the chain's packages
has finished loading (the chain's depth is counted over the modules under
the hooked modules' packages, the only ones whose loading is watched). An
import that fails runs no callback; the next successful one does.

The finder sits first on ``sys.meta_path``; for any name outside the
watched packages it answers at once, so an import elsewhere costs one
string comparison.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

logger = logging.getLogger("sglang_dspark_dp")

Callback = Callable[[ModuleType], None]

_lock = threading.RLock()
#: Module name -> callbacks still waiting for its import.
_waiting: dict[str, list[Callback]] = {}
#: Callbacks whose module has loaded, waiting for its import chain to settle.
_ready: list[tuple[Callback, ModuleType]] = []
#: Packages (``"a.b."``) whose modules' loading is watched.
_prefixes: tuple[str, ...] = ()
_state = threading.local()


def when_imported(name: str, callback: Callback) -> None:
    """Run ``callback(module)`` once module ``name`` is imported: now if it
    already is, else after the import that first brings it in settles."""
    module = sys.modules.get(name)
    if module is not None:
        _call(callback, module)
        return
    with _lock:
        _waiting.setdefault(name, []).append(callback)
        _watch(name)
        _install()


def waiting() -> list[str]:
    """The modules whose import some callback still waits for."""
    with _lock:
        return sorted(_waiting)


def discard() -> None:
    """Forget every callback not run yet (the finder stays, idle)."""
    global _prefixes
    with _lock:
        _waiting.clear()
        _ready.clear()
        _prefixes = ()


def _watch(name: str) -> None:
    global _prefixes
    package = name.rpartition(".")[0]
    prefix = f"{package}." if package else f"{name}."
    if not any(prefix.startswith(p) for p in _prefixes):
        kept = tuple(p for p in _prefixes if not p.startswith(prefix))
        _prefixes = (*kept, prefix)


def _watched(name: str) -> bool:
    return name in _waiting or name.startswith(_prefixes)


def _call(callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception:  # a callback never breaks the import that ran it
        logger.exception(
            "sglang-dspark-dp: a post-import callback for %s failed", module.__name__
        )


def _loaded(module: ModuleType) -> None:
    with _lock:
        for callback in _waiting.pop(module.__name__, ()):
            _ready.append((callback, module))


def _flush() -> None:
    while True:
        with _lock:
            if not _ready:
                return
            callback, module = _ready.pop(0)
        _call(callback, module)


def _depth() -> int:
    return getattr(_state, "depth", 0)


def _chained(exec_module: Callable[[ModuleType], None]) -> Callable[..., None]:
    def exec_module_then_notify(module: ModuleType) -> None:
        _state.depth = _depth() + 1
        ok = False
        try:
            exec_module(module)
            ok = True
        finally:
            _state.depth = _depth() - 1
            if ok:
                _loaded(module)
            if _depth() == 0:
                _flush()

    return exec_module_then_notify


class _Finder:
    """Finds nothing itself: for a watched name it asks the finders after
    it and chains the loader they return."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not _prefixes or not _watched(fullname):
            return None
        spec = None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                break
        if spec is None:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if (
            exec_module is None
            or isinstance(loader, type)
            or not hasattr(loader, "__dict__")
        ):
            return spec  # a loader we cannot chain: the module loads as usual
        # Per-module loader instance: chain its exec_module on the instance,
        # so the module's __loader__ keeps its type for every other reader.
        loader.exec_module = _chained(exec_module)
        return spec


def _install() -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
