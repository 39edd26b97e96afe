"""Dumping PyTorch's flight recorder of this process to a file, as a server
dumps it: shared by the watch (a server process) and the harnesses'
reader (:mod:`sglang_dspark_dp.harness.flight`).

The recording is PyTorch's own (``TORCH_FR_BUFFER_SIZE`` entries a
process); the dump is the pickle ``torch.distributed.flight_recorder``
reads (``python -m torch.distributed.flight_recorder.fr_trace DIR``).
"""

from __future__ import annotations

import os

#: The flight recorder's buffer size variable, read when a process makes its
#: first process group.
BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
#: PyTorch's prefix of a rank's dump file (the rank is appended).
DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
#: What a dump file is called: ``<PREFIX><rank>`` (the reader infers the
#: prefix and the rank from the trailing digits).
PREFIX = "fr_trace_rank_"


def raw(stack_traces: bool) -> bytes:
    """This process's recorder buffer, pickled as PyTorch dumps it."""
    import torch

    return torch._C._distributed_c10d._dump_fr_trace(
        includeCollectives=True, includeStackTraces=stack_traces
    )


def dump_to(path: str) -> str:
    """Write this process's flight-recorder buffer (with stack traces) to
    ``path`` (a real server's dump name: ``TORCH_FR_DUMP_TEMP_FILE`` and
    the rank); returns it."""
    data = raw(stack_traces=True)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.partial"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
