"""What the draft-metadata benchmarks share: the checkout they measure, the
children they start (one per Python or SGLang site), their figures and
their Markdown tables.

Each script imports it as ``sglang_dspark_dp_bench.draft_metadata.bench_common``
when the benchmarks are installed, else from beside itself (a script run
from a checkout, as on the GPU machine). Standard library only, so that a
child that times its own imports is not charged for it.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


def sglang_version() -> str:
    try:
        from importlib.metadata import version

        return version("sglang")
    except Exception:
        import sglang

        return str(getattr(sglang, "__version__", "unknown"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[k]


def sleep_cycles_per_ms(torch: Any, cycles: int) -> float:
    """GPU cycles of ``torch.cuda._sleep`` per millisecond, from CUDA events
    around one sleep of ``cycles``."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


def child_env(
    site: str | None = None, drop: Iterable[str] = ("SGLANG_PLUGINS",)
) -> dict[str, str]:
    """A child's environment: this one without ``drop``, with ``site`` (an
    SGLang install's site-packages) and the checkout's plugin first on
    ``PYTHONPATH``."""
    env = dict(os.environ)
    for name in drop:
        env.pop(name, None)
    parts = [site] if site else []
    parts.append(str(REPO_ROOT / "python"))
    if env.get("PYTHONPATH"):
        parts.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(parts)
    return env


def parse_pairs(values: list[str], flag: str) -> list[tuple[str, str]]:
    out = []
    for v in values or []:
        label, sep, path = v.partition("=")
        if not sep or not label or not path:
            raise SystemExit(f"{flag} expects LABEL=PATH, got {v!r}")
        out.append((label, path))
    return out


def compare_targets(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """``compare``'s children, ``(label, python, site)``: one per ``--python
    LABEL=PYTHON`` and per ``--site LABEL=SITE`` (this Python), else this
    Python's own SGLang."""
    targets = [(label, py, None) for label, py in parse_pairs(args.python, "--python")]
    targets += [
        (label, sys.executable, site)
        for label, site in parse_pairs(args.site, "--site")
    ]
    if not targets:
        targets = [("installed", sys.executable, None)]
    return targets


def table_lines(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    """A Markdown table: the header, the rule, a line per row."""
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]

    def line(cells: Sequence[Any]) -> str:
        pairs = zip(cells, widths, strict=True)
        return "| " + " | ".join(str(c).ljust(w) for c, w in pairs) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return [line(head), sep, *(line(r) for r in rows)]
