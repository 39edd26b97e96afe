"""Where in SGLang's source a collective comes from: its communication
layer, and the DSpark decision sites a stack frame can name.

A flight-recorder entry carries the Python stack that entered the
collective. Its call site is the first frame in ``sglang/`` outside the
communication layer (``sglang/srt/distributed/``: ``GroupCoordinator`` and
its helpers, which every caller goes through); its decision site is the
first frame, innermost first, that :data:`DECISION_FRAMES` names. The paths
are relative to the ``sglang`` package and hold on every release that ships
DSpark (0.5.16-0.5.23).
"""

from __future__ import annotations

import os

#: The package folder a frame must be under to be SGLang's.
PACKAGE = f"{os.sep}sglang{os.sep}"
#: SGLang's communication layer: collectives pass through it.
COMM_LAYER = ("srt/distributed/",)

#: ``(path under sglang/, function or "*", decision site)``, most specific
#: first. The sites are :mod:`sglang_dspark_dp.harness.diverge`'s keys.
DECISION_FRAMES: tuple[tuple[str, str, str], ...] = (
    ("srt/speculative/spec_tp_sync.py", "available_memory_gb", "memory"),
    (
        "srt/speculative/dspark_components/dspark_worker_v2.py",
        "init_cuda_graphs",
        "capture",
    ),
    ("srt/speculative/dspark_components/dspark_draft_sampler.py", "*", "folded"),
    (
        "srt/speculative/dspark_components/dspark_planner.py",
        "_schedule_verify_lens",
        "verify-lens",
    ),
    ("srt/speculative/dspark_components/dspark_planner.py", "*", "verify-budget"),
    ("srt/speculative/dspark_components/dspark_draft.py", "*", "draft"),
    ("srt/model_executor/cuda_graph_runner.py", "*", "draft"),
    ("srt/layers/dp_attention.py", "*", "draft"),
    ("srt/managers/scheduler.py", "run_batch", "entry"),
    ("srt/managers/scheduler.py", "*", "step-sync"),
)


def _sglang_path(filename: str) -> str | None:
    """``filename`` relative to the ``sglang`` package (None: not SGLang's).
    The last ``sglang/`` folder counts, so a checkout named ``sglang`` is
    not taken for the package."""
    norm = filename.replace("\\", "/")
    marker = "/sglang/"
    at = norm.rfind(marker)
    if at < 0 or "/sglang_dspark_dp/" in norm:
        return None
    return norm[at + len(marker) :]


def sglang_call_site(frames: tuple[tuple[str, str, int], ...]) -> str:
    """``path:line (function)`` of the first SGLang frame outside the
    communication layer (frames innermost first; empty: none)."""
    for name, filename, line in frames:
        path = _sglang_path(filename)
        if path is None or path.startswith(COMM_LAYER):
            continue
        return f"sglang/{path}:{line} ({name})"
    return ""


def decision_site(frames: tuple[tuple[str, str, int], ...]) -> str:
    """The first DSpark decision site the frames pass through (innermost
    first; empty: none)."""
    for name, filename, _ in frames:
        path = _sglang_path(filename)
        if path is None:
            continue
        for where, function, site in DECISION_FRAMES:
            if path == where and function in ("*", name):
                return site
    return ""
