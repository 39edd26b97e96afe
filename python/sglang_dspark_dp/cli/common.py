"""What the commands share: exit statuses, the argument parser that fails in
one line, argument types and the options several commands take, the one
line a command that cannot run prints, and SGLang's import noise kept out
of the way."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2


def err(msg: str) -> None:
    print(f"sglang-dspark-dp: {msg}", file=sys.stderr)


def cannot(exc: object, what: str = "cannot run") -> int:
    """Say why in one line (``what: exc``) and return ``EXIT_CANNOT``."""
    err(f"{what}: {exc}")
    return EXIT_CANNOT


def load_api() -> Any | None:
    """The installed SGLang's API (``adapter.load_sglang_api``), or None
    once :func:`cannot` has said why (no DSpark, a renamed target)."""
    from sglang_dspark_dp import adapter
    from sglang_dspark_dp.outcome import DidNotEnable

    try:
        return adapter.load_sglang_api()
    except DidNotEnable as exc:
        cannot(exc)
        return None


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one clear line
        self.print_usage(sys.stderr)
        err(message)
        raise SystemExit(EXIT_CANNOT)


def _number(name: str, text: str, convert: Callable[[str], Any], what: str) -> Any:
    try:
        return convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{name} must be {what}, got {text!r}"
        ) from None


def int_arg(name: str, lo: int | None = None, hi: int | None = None):
    """An argparse type: an integer in ``[lo, hi]``, else an error naming
    ``name`` and the value."""

    def parse(text: str) -> int:
        value = _number(name, text, int, "an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {span}, got {value}")
        return value

    return parse


def seconds_arg(name: str):
    """An argparse type: a positive number of seconds."""

    def parse(text: str) -> float:
        value = _number(name, text, float, "a number of seconds")
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(
                f"{name} must be a positive number of seconds, got {text!r}"
            )
        return value

    return parse


def choices_arg(name: str, allowed: tuple[Any, ...], convert: Any = str):
    """An argparse type: a comma list of ``allowed`` values (``convert``
    reads each), in the order given, each once."""

    def parse(text: str) -> tuple[Any, ...]:
        out = []
        for raw in text.split(","):
            raw = raw.strip()
            try:
                value = convert(raw)
            except ValueError:
                value = None
            if value not in allowed:
                raise argparse.ArgumentTypeError(
                    f"{name} takes {', '.join(map(str, allowed))} (comma-separated), "
                    f"got {raw!r}"
                )
            if value not in out:
                out.append(value)
        return tuple(out)

    return parse


def add_int(
    p: argparse.ArgumentParser,
    name: str,
    lo: int | None,
    hi: int | None,
    default: int | None,
    help: str | None = None,
) -> None:
    """``name``: an integer in ``[lo, hi]`` (:func:`int_arg`)."""
    p.add_argument(name, type=int_arg(name, lo, hi), default=default, help=help)


def add_seconds(
    p: argparse.ArgumentParser, name: str, default: float, help: str | None = None
) -> None:
    """``name``: a positive number of seconds (:func:`seconds_arg`)."""
    p.add_argument(name, type=seconds_arg(name), default=default, help=help)


def add_flag(p: argparse.ArgumentParser, name: str, help: str | None = None) -> None:
    p.add_argument(name, action="store_true", help=help)


def add_dp(p: argparse.ArgumentParser, default: int, help: str | None = None) -> None:
    """``--dp``: simulated DP ranks, 2 to 16."""
    add_int(p, "--dp", 2, 16, default, help)


def add_steps(p: argparse.ArgumentParser, default: int) -> None:
    """``--steps``: decode steps per EP tier."""
    add_int(
        p, "--steps", 1, None, default, f"decode steps per EP tier (default {default})"
    )


def add_seed(p: argparse.ArgumentParser) -> None:
    add_int(p, "--seed", 0, None, 0)


def quiet_sglang() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
