"""The one place that states which SGLang releases this plugin supports.

Like OpenTelemetry's ``opentelemetry-instrumentation-*`` packages, the range
lives here once; ``pyproject.toml``'s ``sglang`` extra mirrors it and a test
keeps the two in step.
"""

from __future__ import annotations

import functools

__version__ = "0.1.0"

#: Requirement string of the library this plugin patches.
_instruments = ("sglang >= 0.5.16",)

#: Lowest SGLang release that ships DSpark with a DP-attention draft path.
MIN_SGLANG = (0, 5, 16)


def parse_version(text: str) -> tuple[int, ...]:
    """``"0.5.16.post2"`` -> ``(0, 5, 16)``; non-numeric tails are dropped."""
    parts: list[int] = []
    for piece in text.split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(piece):
            break
    return tuple(parts)


@functools.lru_cache(maxsize=1)
def installed_sglang_version() -> str | None:
    """The installed SGLang distribution's version, or None if absent (read
    once per process: every status line asks for it)."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        return None


def missing_runtime() -> str | None:
    """Why SGLang cannot run in this Python (None: SGLang and torch are
    importable), found without importing either."""
    import importlib.util
    import sys

    def absent(name: str) -> bool:
        try:
            return importlib.util.find_spec(name) is None
        except (ImportError, ValueError):  # a module set to None, a bad spec
            return True

    where = f"this Python ({sys.executable})"
    if absent("sglang"):
        return f"SGLang is not installed in {where}"
    if absent("torch"):
        return f"torch, which SGLang needs, is not installed in {where}"
    return None


def version_supported(version: str) -> bool:
    return parse_version(version) >= MIN_SGLANG
