"""What the commands share: exit statuses, the argument parser that fails in
one line, argument checks, and SGLang's import noise kept out of the way."""

from __future__ import annotations

import argparse
import os
import sys

EXIT_OK, EXIT_FAIL, EXIT_CANNOT = 0, 1, 2


def err(msg: str) -> None:
    print(f"sglang-dspark-dp: {msg}", file=sys.stderr)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # exit 2 with one clear line
        self.print_usage(sys.stderr)
        err(message)
        raise SystemExit(EXIT_CANNOT)


def int_arg(name: str, lo: int | None = None, hi: int | None = None):
    """An argparse type: an integer in ``[lo, hi]``, else an error naming
    ``name`` and the value."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer, got {text!r}"
            ) from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            span = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise argparse.ArgumentTypeError(f"{name} must be {span}, got {value}")
        return value

    return parse


def seconds_arg(name: str):
    """An argparse type: a positive number of seconds."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number of seconds, got {text!r}"
            ) from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(
                f"{name} must be a positive number of seconds, got {text!r}"
            )
        return value

    return parse


def quiet_sglang() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
