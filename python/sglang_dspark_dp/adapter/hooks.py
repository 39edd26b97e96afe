"""SGLang's ``HookRegistry``: registering, applying and removing hooks,
and its bookkeeping (``_hooks``, ``_patched``)."""

from __future__ import annotations

from typing import Any

from sglang_dspark_dp.outcome import DidNotEnable


def hook_registry() -> tuple[Any, Any]:
    """SGLang's ``(HookRegistry, HookType)``, or DidNotEnable."""
    try:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    except ImportError as exc:
        raise DidNotEnable(f"the installed SGLang has no plugin API ({exc})") from exc
    return HookRegistry, HookType


def is_patched(target: str) -> bool:
    """Whether ``HookRegistry`` has already applied hooks to ``target``."""
    registry, _ = hook_registry()
    return target in registry._patched


def hooks_on(target: str) -> list[Any]:
    """The hook callables registered on ``target``, in order."""
    registry, _ = hook_registry()
    return [entry[1] for entry in registry._hooks.get(target, [])]


#: The distribution the hooks come from, as SGLang's registry names it.
DIST_NAME = "sglang-dspark-dp"


def hook_source() -> Any:
    """This plugin as SGLang's ``HookSource`` names a hook's origin (None
    where the registry has none): the hooks are registered when DSpark's
    modules are imported, after ``load_plugins()`` has left its context,
    so the registry would not know them otherwise."""
    try:
        from sglang.srt.plugins.hook_registry import HookSource
    except ImportError:
        return None
    from sglang_dspark_dp.plugin import PLUGIN_NAME

    return HookSource(PLUGIN_NAME, DIST_NAME)


def hook_origins(target: str) -> list[str | None]:
    """Per hook registered on ``target``, in order, the plugin SGLang's
    registry names as its origin (None: it knows none)."""
    registry, _ = hook_registry()
    out = []
    for entry in registry._hooks.get(target, []):
        source = entry[2] if len(entry) > 2 else None
        out.append(getattr(source, "plugin_name", None))
    return out


def register_around(target: str, hook: Any) -> None:
    from sglang_dspark_dp.adapter.base import signature_of

    registry, kind = hook_registry()
    source = hook_source()
    sig = signature_of(registry.register)
    if source is not None and sig is not None and "source" in sig.parameters:
        registry.register(target, hook, kind.AROUND, source=source)
    else:
        registry.register(target, hook, kind.AROUND)


def apply_hooks() -> None:
    registry, _ = hook_registry()
    registry.apply_hooks()


def remove_hook(target: str, hook: Any, owner: type, attr: str, original: Any) -> None:
    """Drop ``hook`` from ``target``, put ``original`` back on ``owner`` and
    re-apply any other plugin's hooks on the same target."""
    registry, _ = hook_registry()
    others = [h for h in registry._hooks.get(target, []) if h[1] is not hook]
    if target in registry._patched:
        setattr(owner, attr, original)
        registry._patched.discard(target)
    if others:
        registry._hooks[target] = others
        registry.apply_hooks()
    else:
        registry._hooks.pop(target, None)


#: SGLang's once-per-process flag of ``load_plugins()``.
PLUGINS_MODULE = "sglang.srt.plugins"
LOADED_FLAG = "_plugins_loaded"


def load_plugins(*, dspark: bool = True) -> None:
    """SGLang's own ``load_plugins()`` (every installed plugin, then the
    hooks applied), as a server process calls it; with ``dspark``, then
    DSpark's worker module imported, as the scheduler imports it when it
    builds its speculative worker (where the plugin's repairs are armed to
    apply). ``dspark=False``: a process that never runs DSpark."""
    import importlib

    from sglang_dspark_dp.adapter.modules import WORKER_MODULE

    importlib.import_module(PLUGINS_MODULE).load_plugins()
    if dspark:
        importlib.import_module(WORKER_MODULE)


def forget_loaded_plugins() -> None:
    """Let ``load_plugins()`` run again in this process (a forked rank that
    stands for a server process starting afresh)."""
    import importlib

    module = importlib.import_module(PLUGINS_MODULE)
    if hasattr(module, LOADED_FLAG):
        setattr(module, LOADED_FLAG, False)


def add_around(target: str, hook: Any, owner: type, attr: str) -> Any:
    """Register ``hook`` on ``target`` outside every hook already there and
    return ``owner.attr`` as the installed SGLang wrote it. Where the target
    is applied already, the stock method is put back and every hook
    re-applied (the registry's own order: the first registered innermost),
    so the new hook sees what the earlier ones make of the call."""
    import inspect

    registry, _ = hook_registry()
    stock = inspect.unwrap(owner.__dict__[attr])
    register_around(target, hook)
    if target in registry._patched:
        setattr(owner, attr, stock)
        registry._patched.discard(target)
        registry.apply_hooks()
    return stock
