"""PyTorch's flight recorder: turned on in a rank, dumped one file per rank,
read back and compared across ranks to find where their collectives part.

The recording is PyTorch's own (``TORCH_FR_BUFFER_SIZE`` entries a process,
gloo records natively from torch 2.11, NCCL as always): nothing here wraps
a collective. A rank dumps its buffer with stack traces
(:func:`dump`) as ``<dir>/fr_trace_rank_<rank>``, the pickle that
``torch.distributed.flight_recorder`` reads (``python -m
torch.distributed.flight_recorder.fr_trace DIR``), so a real server's dumps
(``TORCH_FR_DUMP_TEMP_FILE``, one file per rank) are read the same way
(:func:`load_dir`).

:func:`first_mismatch` lines up each process group's collectives by their
``collective_seq_id`` across the group's ranks and finds the first one
where they differ: another op, other sizes or dtypes, or a collective some
ranks entered and another never did. Each entry's call site is the first
frame in ``sglang/`` that is not SGLang's own communication layer
(:data:`sglang_dspark_dp.adapter.sites.COMM_LAYER`).
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
from collections.abc import Callable
from typing import Any

from sglang_dspark_dp.flight_dump import BUFFER_ENV, PREFIX, dump_to

_TRAILING_RANK = re.compile(r"(\d+)$")


class DumpError(ValueError):
    """A dump folder that cannot be read as flight-recorder dumps."""


def enable(entries: int) -> None:
    """Record up to ``entries`` collectives in this process (before its
    first process group is made)."""
    os.environ[BUFFER_ENV] = str(int(entries))


def dump(directory: str, rank: int) -> str:
    """Write this process's flight-recorder buffer (with stack traces) to
    ``directory`` as rank ``rank``'s dump; returns its path."""
    return dump_to(os.path.join(directory, f"{PREFIX}{rank}"))


# --------------------------------------------------------------------------
# Reading dumps.
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Entry:
    """One collective one rank entered, as the recorder kept it."""

    rank: int
    record_id: int
    pg: str  # the process group's id (its name)
    pg_desc: str
    seq: int  # collective_seq_id within the group
    op: str  # e.g. "gloo:all_reduce"
    input_sizes: tuple[tuple[int, ...], ...]
    output_sizes: tuple[tuple[int, ...], ...]
    dtypes: tuple[str, ...]
    state: str
    created_ns: int
    frames: tuple[tuple[str, str, int], ...]  # (function, file, line), innermost first

    @property
    def signature(self) -> tuple[Any, ...]:
        return (self.op, self.input_sizes, self.output_sizes, self.dtypes)

    def call_site(self) -> str:
        """The first frame in ``sglang/`` outside its communication layer
        (empty: none; the collective was entered from elsewhere)."""
        from sglang_dspark_dp.adapter.sites import sglang_call_site

        return sglang_call_site(self.frames)

    def harness_site(self) -> str:
        """The first frame's function in this package (empty: none)."""
        for name, filename, _ in self.frames:
            if f"{os.sep}sglang_dspark_dp{os.sep}" in filename:
                return name
        return ""

    def describe(self) -> str:
        sizes = ",".join("x".join(map(str, s)) or "scalar" for s in self.input_sizes)
        dtypes = ",".join(self.dtypes)
        return f"{self.op}[{sizes or '-'}; {dtypes or '-'}]"


@dataclasses.dataclass
class RankDump:
    rank: int
    entries: list[Entry]
    #: Process group id -> its ranks, where the dump says (NCCL) or a
    #: sidecar does.
    pg_ranks: dict[str, tuple[int, ...]]
    path: str = ""


def _ranks_of(config: Any) -> tuple[int, ...] | None:
    if not isinstance(config, dict):
        return None
    raw = config.get("ranks")
    if isinstance(raw, str):
        raw = [x for x in re.split(r"[^\d]+", raw) if x]
    try:
        ranks = tuple(int(x) for x in raw or ())
    except (TypeError, ValueError):
        return None
    return ranks or None


def _entry(rank: int, raw: dict[str, Any]) -> Entry | None:
    if raw.get("is_p2p"):
        return None
    pg = raw.get("process_group") or ("?", "")
    frames = tuple(
        (str(f.get("name", "")), str(f.get("filename", "")), int(f.get("line", 0)))
        for f in raw.get("frames") or ()
    )
    return Entry(
        rank=rank,
        record_id=int(raw.get("record_id", 0)),
        pg=str(pg[0]),
        pg_desc=str(pg[1]) if len(pg) > 1 else "",
        seq=int(raw.get("collective_seq_id", 0)),
        op=str(raw.get("profiling_name", "?")),
        input_sizes=tuple(tuple(int(d) for d in s) for s in raw.get("input_sizes", ())),
        output_sizes=tuple(
            tuple(int(d) for d in s) for s in raw.get("output_sizes", ())
        ),
        dtypes=tuple(str(d) for d in raw.get("input_dtypes", ())),
        state=str(raw.get("state", "")),
        created_ns=int(raw.get("time_created_ns", 0)),
        frames=frames,
    )


def load_file(path: str, rank: int | None = None) -> RankDump:
    """One rank's dump (``rank``: from the file name's trailing digits when
    not given)."""
    if rank is None:
        m = _TRAILING_RANK.search(os.path.basename(path))
        if m is None:
            raise DumpError(f"{path}: no rank at the end of the file name")
        rank = int(m.group(1))
    try:
        with open(path, "rb") as f:
            data = pickle.load(f)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError) as exc:
        raise DumpError(
            f"{path}: not a flight-recorder dump ({type(exc).__name__})"
        ) from None
    if not isinstance(data, dict) or "entries" not in data:
        raise DumpError(f"{path}: not a flight-recorder dump (no 'entries')")
    entries = [e for e in (_entry(rank, raw) for raw in data["entries"]) if e]
    entries.sort(key=lambda e: e.record_id)
    pg_ranks = {}
    for pg, config in (data.get("pg_config") or {}).items():
        ranks = _ranks_of(config)
        if ranks:
            pg_ranks[str(pg)] = ranks
    return RankDump(rank, entries, pg_ranks, path)


def load_dir(directory: str) -> dict[int, RankDump]:
    """Every rank's dump in ``directory`` (files ending in the rank's
    number; sidecars and partial files are left alone)."""
    if not os.path.isdir(directory):
        raise DumpError(f"DUMP_DIR {directory!r} is not a folder")
    dumps: dict[int, RankDump] = {}
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        m = _TRAILING_RANK.search(name)
        if not os.path.isfile(path) or m is None:
            continue
        rank = int(m.group(1))
        if rank in dumps:
            raise DumpError(
                f"{directory}: two dumps for rank {rank} ({os.path.basename(dumps[rank].path)}, {name})"
            )
        dumps[rank] = load_file(path, rank)
    if not dumps:
        raise DumpError(
            f"{directory}: no flight-recorder dumps (one file per rank, named "
            f"<prefix><rank>, e.g. {PREFIX}0)"
        )
    return dumps


# --------------------------------------------------------------------------
# Comparing ranks.
# --------------------------------------------------------------------------

OP, SIZES, DTYPES, MISSING = "op", "sizes", "dtypes", "missing"
#: How the recorder names the default (world) process group.
WORLD_DESC = "default_pg"


@dataclasses.dataclass
class Mismatch:
    """The first collective of a process group on which its ranks differ."""

    pg: str
    pg_desc: str
    seq: int
    kind: str  # OP | SIZES | DTYPES | MISSING
    #: Rank -> what it entered at this point (None: it never did).
    entries: dict[int, Entry | None]
    #: Rank -> the last collective it entered on any group (where a rank
    #: that never came was instead).
    last: dict[int, Entry | None]

    @property
    def ranks(self) -> list[int]:
        return sorted(self.entries)

    def present(self) -> list[Entry]:
        return [e for e in self.entries.values() if e is not None]

    def created_ns(self) -> int:
        return min((e.created_ns for e in self.present()), default=0)

    def groups_of_ranks(self) -> list[tuple[str, list[int]]]:
        """Ranks that entered the same thing, by what they entered."""
        seen: dict[str, list[int]] = {}
        for rank in self.ranks:
            e = self.entries[rank]
            seen.setdefault("nothing" if e is None else e.describe(), []).append(rank)
        return list(seen.items())

    def describe(self) -> str:
        what = {
            OP: "ranks entered different collectives",
            SIZES: "ranks entered the collective with different sizes",
            DTYPES: "ranks entered the collective with different dtypes",
            MISSING: "a collective some ranks entered and others never did",
        }[self.kind]
        parts = "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {text}"
            for text, rs in self.groups_of_ranks()
        )
        return f"process group {self.pg} ({self.pg_desc}), collective #{self.seq}: {what} ({parts})"


def members(dumps: dict[int, RankDump], sidecar_ranks: dict[str, tuple[int, ...]]):
    """Process group id -> its ranks: from the dumps' own configuration (NCCL
    records it), ``sidecar_ranks``, the default group's being every dumped
    rank, and the ranks with an entry on it."""
    out: dict[str, set[int]] = {}
    for d in dumps.values():
        for pg, ranks in d.pg_ranks.items():
            out.setdefault(pg, set()).update(ranks)
    for pg, ranks in sidecar_ranks.items():
        out.setdefault(pg, set()).update(ranks)
    for d in dumps.values():
        for e in d.entries:
            out.setdefault(e.pg, set()).add(d.rank)
            if e.pg_desc == WORLD_DESC:  # the default group: every rank
                out[e.pg].update(dumps)
    return {pg: tuple(sorted(r)) for pg, r in out.items()}


def first_mismatch(
    dumps: dict[int, RankDump],
    sidecar_ranks: dict[str, tuple[int, ...]] | None = None,
    order: Callable[[Mismatch], Any] | None = None,
) -> Mismatch | None:
    """The earliest collective on which the ranks of a group differ (None:
    every group's ranks entered the same collectives, as far as every
    rank's buffer reaches).

    Each group's first mismatch is a candidate; where several groups part
    (a rank that skips one group's collective goes on to the next group's,
    where the others never come), ``order`` ranks them by where they sit in
    the program (a caller that knows it); the clock, which the scheduling of
    the ranks' processes decides, only breaks what ``order`` leaves tied."""
    groups = members(dumps, sidecar_ranks or {})
    found: list[Mismatch] = []
    for pg, ranks in groups.items():
        ranks = tuple(r for r in ranks if r in dumps)
        if len(ranks) < 2:
            continue
        by_rank = {r: {e.seq: e for e in dumps[r].entries if e.pg == pg} for r in ranks}
        lows = [min(s) for s in by_rank.values() if s]
        if not lows:
            continue
        start = max(lows)  # the oldest collective every buffer still holds
        stop = max(max(s) for s in by_rank.values() if s)
        for seq in range(start, stop + 1):
            at = {r: by_rank[r].get(seq) for r in ranks}
            present = [e for e in at.values() if e is not None]
            if len(present) < len(at):
                kind = MISSING
            elif len({e.op for e in present}) > 1:
                kind = OP
            elif len({(e.input_sizes, e.output_sizes) for e in present}) > 1:
                kind = SIZES
            elif len({e.dtypes for e in present}) > 1:
                kind = DTYPES
            else:
                continue
            last = {
                r: (dumps[r].entries[-1] if dumps[r].entries else None) for r in ranks
            }
            desc = present[0].pg_desc if present else ""
            found.append(Mismatch(pg, desc, seq, kind, at, last))
            break
    if not found:
        return None
    rank = order or (lambda m: 0)
    return min(found, key=lambda m: (rank(m), m.created_ns(), m.pg))
