"""Which caches a server's first-time JIT filled, and when (stdlib only).

    python3 scripts/device/jit_census.py [--since EPOCH] [--out FILE] [ROOT]...

Walks ROOTs (default: ``$HOME`` and ``/tmp``, without the chain's own
``/tmp/dsdp`` and ``/tmp/e2e`` and this checkout) for files modified after ``--since``
(default: the first chain call's start, ``/tmp/dsdp-chain-start``, which
``chain.sh`` touches once), and prints one
line per cache folder (a ROOT's entry, one level further for the hidden
ones such as ``~/.cache/NAME``): files, MiB, the first and last file's time
(UTC). Then each folder's entries one level down (a kernel's build folder,
say), newest last, so that the times line up with a server log's phases:
the library that compiled during the target capture is the folder whose
files were written then.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

#: Not caches: the unpacked sites, the e2e run's files, this checkout.
SKIP = ("/tmp/dsdp", "/tmp/e2e", str(Path(__file__).resolve().parents[2]))
START = Path("/tmp/dsdp-chain-start")


def cache_dir(root: Path, path: Path) -> Path:
    """The folder a file is counted under: ROOT's entry, or for a hidden
    entry with children (``.cache``, ``.triton``) the entry below it."""
    parts = path.relative_to(root).parts
    depth = 2 if parts[0].startswith(".") and len(parts) > 2 else 1
    return root.joinpath(*parts[:depth])


def walk(roots: list[Path], since: float, skip: tuple[str, ...] = SKIP):
    """``(file, mtime, size)`` of every file modified after ``since``."""
    for root in roots:
        for top, dirs, files in os.walk(root):
            if top.startswith(skip):
                dirs[:] = []
                continue
            dirs[:] = [d for d in dirs if not os.path.join(top, d).startswith(skip)]
            for name in files:
                p = Path(top, name)
                try:
                    st = p.lstat()
                except OSError:
                    continue
                if st.st_mtime > since:
                    yield root, p, st.st_mtime, st.st_size


def _t(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch))


def census(
    roots: list[Path], since: float, skip: tuple[str, ...] = SKIP, per_dir: int = 12
) -> list[str]:
    groups: dict[Path, list[tuple[Path, float, int]]] = defaultdict(list)
    for root, p, mtime, size in walk(roots, since, skip):
        groups[cache_dir(root, p)].append((p, mtime, size))
    out = [f"files modified after {_t(since)} UTC, by folder (largest first)"]
    order = sorted(groups, key=lambda d: -sum(s for _, _, s in groups[d]))
    for d in order:
        files = groups[d]
        mib = sum(s for _, _, s in files) / 2**20
        first, last = min(m for _, m, _ in files), max(m for _, m, _ in files)
        out.append(f"{mib:8.1f} MiB {len(files):6d} files {_t(first)}-{_t(last)}  {d}")
    for d in order:
        entries: dict[str, list[float]] = defaultdict(list)
        for p, mtime, _ in groups[d]:
            rel = p.relative_to(d).parts
            entries[rel[0] if len(rel) > 1 else "."].append(mtime)
        out.append(f"== {d}: {len(entries)} entries, by last write")
        shown = sorted(entries.items(), key=lambda kv: max(kv[1]))
        for name, times in shown[-per_dir:]:
            out.append(f"  {_t(min(times))}-{_t(max(times))} {len(times):5d}  {name}")
        if len(shown) > per_dir:
            out.append(f"  ... {len(shown) - per_dir} earlier entries")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("roots", nargs="*", type=Path)
    p.add_argument("--since", type=float, help=f"epoch seconds (default: {START}'s)")
    p.add_argument("--out", type=Path, help="also write the lines here")
    a = p.parse_args(argv)
    roots = a.roots or [Path.home(), Path("/tmp")]
    missing = [str(r) for r in roots if not r.is_dir()]
    if missing:
        print(f"jit_census: ROOT {missing[0]}: no such folder", file=sys.stderr)
        return 2
    since = a.since
    if since is None:
        since = START.stat().st_mtime if START.exists() else 0.0
    lines = census([r.resolve() for r in roots], since)
    print("\n".join(lines))
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
