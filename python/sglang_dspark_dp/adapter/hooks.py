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


def register_around(target: str, hook: Any) -> None:
    registry, kind = hook_registry()
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
