"""Stage the wheels of ``wheels.lock`` for the device, in batches to carry.

Here (a machine that reaches PyPI), before the device calls:

    python3 scripts/device/stage.py            # download, repack, pack, batch
    python3 scripts/device/stage.py --check    # the batches match the lock

1. ``download``: each lock entry's cp312 manylinux x86_64 wheel, ``pip
   download --no-deps``, into ``.stage/wheels/`` (kept between runs).
2. ``repack``: ``sglang-kernel`` without ``sgl_kernel/flash_ops.abi3.so``
   (FA3; only ``sgl_kernel.flash_attn`` loads it, the DSV4 path does not) and
   ``sgl_kernel/sm100/`` (the H200 is sm90).
3. ``pack``: each wheel's files as one ``tar.xz`` (what ``pip install
   --target`` would lay down: ``*.data/purelib`` and ``platlib`` at the top,
   the other ``*.data`` folders dropped), fixed mtimes, so the same wheels
   give the same bytes. Into ``.stage/archives/``.
4. ``batch``: the archives into ``.carry1/ .carry2/ ...`` at the repository
   root (git-ignored: ``/.carry*/``), first-fit decreasing under
   ``--batch-mib``; an archive larger than that is cut into parts that
   ``unpack.py`` joins and checks (sha256) on the device. Every batch holds
   ``manifest.json``: every archive, its target, sha256, size and parts.
   Extra files (the GSM8K data) go into the last batch with room.

``--jit FILE`` stages the first server's kernel JIT (SGLang's nvcc-built
modules, carried back by ``chain.sh jit:pack``) as ``.carry-jit/``, and
``--check-jit`` checks it (README.md: "The first server's JIT, carried").

The device side is ``unpack.py`` (stdlib only); the chain of calls is in
README.md beside this file.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LOCK = HERE / "wheels.lock"
STAGE = ROOT / ".stage"
WHEELS = STAGE / "wheels"
ARCHIVES = STAGE / "archives"
CARRY_PREFIX = ".carry"
MANIFEST = "manifest.json"
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
#: Files dropped from a wheel when repacking, by distribution.
DROP = {
    "sglang-kernel": (
        lambda name: name == "sgl_kernel/flash_ops.abi3.so"
        or name.startswith("sgl_kernel/sm100/")
    ),
}
XZ_PRESET = 9
#: What one device call carries at most: the working tree and its batch.
CALL_LIMIT = 64 * 2**20


def norm(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


#: Lock sections of bare names (not carried); every other section is carried.
BARE_SECTIONS = ("image", "skip")


def parse_lock(text: str) -> dict[str, dict[str, str]]:
    """``{section: {normalised name: version}}`` (version ``""`` in the
    sections of bare names); a bad line is an error naming the line."""
    sections: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    section = ""
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            current = sections.setdefault(section, {})
            continue
        if current is None:
            raise ValueError(f"wheels.lock line {number}: {raw!r} before a [section]")
        name, sep, version = line.partition("==")
        bare = section in BARE_SECTIONS
        if bare and sep:
            raise ValueError(
                f"wheels.lock line {number}: {raw!r}: [{section}] takes bare names"
            )
        if not bare and (not sep or not name.strip() or not version.strip()):
            raise ValueError(f"wheels.lock line {number}: {raw!r} is not name==version")
        key = norm(name.strip())
        # A name once per section; a site section may repeat a name of another
        # site, never one of [common] or of a bare section.
        clash = [
            other
            for other, entries in sections.items()
            if key in entries
            and (
                other == section
                or not (other.startswith("site") and section.startswith("site"))
            )
        ]
        if clash:
            raise ValueError(
                f"wheels.lock line {number}: {name.strip()} already in [{clash[0]}]"
            )
        current[key] = version.strip()
    return sections


def read_lock(path: Path = LOCK) -> dict[str, dict[str, str]]:
    return parse_lock(path.read_text())


def targets(lock: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The carried sections, each unpacked into its own folder: ``common``
    and each ``siteNN``."""
    return {k: v for k, v in lock.items() if k not in BARE_SECTIONS}


def lock_digest(lock: dict[str, dict[str, str]]) -> str:
    """sha256 of what is carried (comments and bare sections left out)."""
    text = json.dumps(targets(lock), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def site_entries(lock: dict[str, dict[str, str]], release: str) -> dict[str, str]:
    """What one release's site holds: ``[common]`` and ``[siteNN]``
    (``release``: ``0.5.17``, ``17`` or ``site17``)."""
    site = "site" + release.rsplit(".", 1)[-1].removeprefix("site")
    if site not in lock:
        raise KeyError(f"wheels.lock has no [{site}] section")
    return {**lock.get("common", {}), **lock[site]}


def wheel_name_version(filename: str) -> tuple[str, str]:
    parts = filename[: -len(".whl")].split("-")
    return norm(parts[0]), parts[1]


def find_wheel(name: str, version: str, folder: Path = WHEELS) -> Path | None:
    for path in sorted(folder.glob("*.whl")):
        if wheel_name_version(path.name) == (name, version):
            return path
    return None


def download(lock: dict[str, dict[str, str]], python: str) -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    for entries in targets(lock).values():
        for name, version in entries.items():
            if find_wheel(name, version):
                continue
            cmd = [python, "-m", "pip", "download", "-q", "--no-deps"]
            cmd += ["--only-binary=:all:", "--python-version", "3.12"]
            cmd += ["--implementation", "cp", "-d", str(WHEELS)]
            for platform in PLATFORMS:
                cmd += ["--platform", platform]
            print(f"download {name}=={version}", flush=True)
            subprocess.run([*cmd, f"{name}=={version}"], check=True)
            if not find_wheel(name, version):
                raise SystemExit(f"no wheel of {name}=={version} in {WHEELS}")


def members(wheel: Path):
    """``(path in the site, ZipInfo)`` of what ``pip --target`` installs."""
    name, _ = wheel_name_version(wheel.name)
    drop = DROP.get(name, lambda _n: False)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            if info.is_dir():
                continue
            path = info.filename
            top, _, rest = path.partition("/")
            if top.endswith(".data"):
                kind, _, inner = rest.partition("/")
                if kind not in ("purelib", "platlib") or not inner:
                    continue
                path = inner
            if drop(path):
                continue
            yield path, info


def pack_one(wheel: str, target: str, out_dir: str) -> dict:
    """One wheel as ``<target>--<wheel stem>.tar.xz``; returns its entry."""
    src = Path(wheel)
    out = Path(out_dir) / f"{target}--{src.name[: -len('.whl')]}.tar.xz"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        raw = 0
        with zipfile.ZipFile(src) as zf, lzma.open(tmp, "wb", preset=XZ_PRESET) as xz:
            with tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for path, info in members(src):
                    data = zf.read(info)
                    raw += len(data)
                    ti = tarfile.TarInfo(path)
                    ti.size = len(data)
                    ti.mtime = 0
                    executable = (info.external_attr >> 16) & 0o111
                    ti.mode = 0o755 if executable else 0o644
                    tar.addfile(ti, io.BytesIO(data))
        tmp.rename(out)
    return {
        "archive": out.name,
        "target": target,
        "wheel": src.name,
        "wheel_bytes": src.stat().st_size,
        "bytes": out.stat().st_size,
        "sha256": sha256(out),
    }


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def pack(lock: dict[str, dict[str, str]], jobs: int) -> list[dict]:
    ARCHIVES.mkdir(parents=True, exist_ok=True)
    work = []
    for target, entries in targets(lock).items():
        for name, version in entries.items():
            wheel = find_wheel(name, version)
            if wheel is None:
                raise SystemExit(f"{name}=={version}: not downloaded (run download)")
            work.append((str(wheel), target, str(ARCHIVES)))
    work.sort(key=lambda w: -Path(w[0]).stat().st_size)  # big ones first
    with ProcessPoolExecutor(jobs) as pool:
        entries = list(pool.map(pack_one, *zip(*work, strict=True)))
    wanted = {e["archive"] for e in entries}
    for stale in ARCHIVES.glob("*.tar.xz"):
        if stale.name not in wanted:
            stale.unlink()
    return sorted(entries, key=lambda e: e["archive"])


def pack_gsm8k(folder: Path) -> Path:
    """``gsm8k.tar.xz`` holding ``gsm8k/test.jsonl`` and ``train.jsonl``."""
    out = STAGE / "gsm8k.tar.xz"
    names = ("test.jsonl", "train.jsonl")
    missing = [n for n in names if not (folder / n).is_file()]
    if missing:
        raise SystemExit(f"--gsm8k {folder}: no {', '.join(missing)}")
    with lzma.open(out, "wb", preset=XZ_PRESET) as xz:
        with tarfile.open(fileobj=xz, mode="w", format=tarfile.GNU_FORMAT) as tar:
            for name in names:
                data = (folder / name).read_bytes()
                info = tarfile.TarInfo(f"gsm8k/{name}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    return out


def plan_batches(sizes: dict[str, int], limit: int) -> list[list[tuple[str, int, int]]]:
    """First-fit decreasing. Each batch is a list of ``(file, offset,
    length)``: a file larger than ``limit`` is cut into parts of at most
    ``limit`` bytes, each placed like a file of its own."""
    pieces = []
    for name, size in sizes.items():
        offset = 0
        while True:
            length = min(limit, size - offset)
            pieces.append((name, offset, length))
            offset += length
            if offset >= size:
                break
    pieces.sort(key=lambda p: (-p[2], p[0], p[1]))
    bins: list[list] = []
    room: list[int] = []
    for piece in pieces:
        for i, free in enumerate(room):
            if piece[2] <= free:
                bins[i].append(piece)
                room[i] -= piece[2]
                break
        else:
            bins.append([piece])
            room.append(limit - piece[2])
    return bins


def part_name(archive: str, offset: int, size: int, length: int) -> str:
    if offset == 0 and length == size:
        return archive
    return f"{archive}.part{offset:012d}"


def batch(entries: list[dict], extras: list[Path], limit_mib: float) -> list[Path]:
    limit = int(limit_mib * 2**20)
    sizes = {e["archive"]: e["bytes"] for e in entries}
    extra_sizes = {p.name: p.stat().st_size for p in extras}
    bins = plan_batches({**sizes, **extra_sizes}, limit)
    for old in ROOT.glob(CARRY_PREFIX + "[0-9]*"):
        shutil.rmtree(old)
    by_name = {e["archive"]: e for e in entries}
    extra_paths = {p.name: p for p in extras}
    for e in entries:
        e["parts"] = []
    extra_rows = []
    folders = []
    for number, pieces in enumerate(bins, 1):
        folder = ROOT / f"{CARRY_PREFIX}{number}"
        folder.mkdir()
        folders.append(folder)
        for name, offset, length in sorted(pieces):
            if name in extra_paths:
                shutil.copy2(extra_paths[name], folder / name)
                extra_rows.append(
                    {
                        "file": name,
                        "batch": folder.name,
                        "bytes": length,
                        "sha256": sha256(extra_paths[name]),
                    }
                )
                continue
            entry = by_name[name]
            piece = part_name(name, offset, entry["bytes"], length)
            with (ARCHIVES / name).open("rb") as src, (folder / piece).open("wb") as f:
                src.seek(offset)
                f.write(src.read(length))
            entry["parts"].append(
                {
                    "file": piece,
                    "batch": folder.name,
                    "offset": offset,
                    "bytes": length,
                    "sha256": sha256(folder / piece),
                }
            )
    for e in entries:
        e["parts"].sort(key=lambda p: p["offset"])
    manifest = {
        "lock_digest": lock_digest(read_lock()),
        "batches": [f.name for f in folders],
        "archives": entries,
        "extras": extra_rows,
    }
    text = json.dumps(manifest, indent=1) + "\n"
    for folder in folders:
        (folder / MANIFEST).write_text(text)
    return folders


def report(folders: list[Path], entries: list[dict], tree_bytes: int) -> None:
    wheels = sum(e["wheel_bytes"] for e in entries)
    packed = sum(e["bytes"] for e in entries)
    print(f"wheels {wheels / 2**20:.1f} MiB -> tar.xz {packed / 2**20:.1f} MiB")
    for folder in folders:
        size = sum(p.stat().st_size for p in folder.iterdir())
        print(
            f"{folder.name}: {len(list(folder.iterdir())) - 1:3d} files, "
            f"{size / 2**20:5.1f} MiB (+ working tree {tree_bytes / 2**20:.1f} MiB)"
        )
        if size + tree_bytes > CALL_LIMIT:
            print(
                f"WARNING {folder.name}: with the working tree over the "
                f"{CALL_LIMIT / 2**20:.0f} MiB a call carries: restage with a "
                "smaller --batch-mib"
            )


def working_tree_bytes() -> int:
    """Bytes of what every call carries anyway: tracked and untracked files
    that git does not ignore."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (ROOT / p.decode()).stat().st_size
        for p in out
        if p and (ROOT / p.decode()).is_file()
    )


def check(lock: dict[str, dict[str, str]]) -> list[str]:
    """What is wrong with the staged batches for this lock (empty: fine)."""
    folders = sorted(ROOT.glob(CARRY_PREFIX + "[0-9]*"))
    if not folders:
        return ["no .carry* batches: run stage.py"]
    manifest = json.loads((folders[0] / MANIFEST).read_text())
    problems = []
    if manifest.get("lock_digest") != lock_digest(lock):
        problems.append("wheels.lock changed since the batches were made")
    have = {(a["target"], wheel_name_version(a["wheel"])) for a in manifest["archives"]}
    for target, entries in targets(lock).items():
        for name, version in entries.items():
            if (target, (name, version)) not in have:
                problems.append(f"[{target}] {name}=={version} not in the batches")
    for a in manifest["archives"]:
        for part in a["parts"]:
            path = ROOT / part["batch"] / part["file"]
            if not path.exists() or path.stat().st_size != part["bytes"]:
                problems.append(f"{path} missing or of the wrong size")
    return problems


#: The JIT batch: SGLang's nvcc-built kernel modules (``load_jit``, the
#: ``tvm_ffi`` cache), carried back from a warm-up call (``chain.sh
#: jit:pack``) and into a fresh machine's ``$HOME`` (``unpack.py``).
JIT_BATCH = CARRY_PREFIX + "-jit"
JIT_FILE = "jit-cache.tar.xz"
JIT_INDEX = "jit.json"
JIT_HOME_DIR = ".cache/tvm-ffi"


def jit_members(tarball: Path) -> tuple[list[str], list[str]]:
    """``(module .so files, problems)`` of a JIT cache tarball: only
    folders and ``.so`` files under ``.cache/tvm-ffi/``, one folder per
    module (``NAME__arch_ARCH__tvmffi_VERSION/NAME.so``)."""
    modules, problems = [], []
    try:
        with tarfile.open(tarball, "r:*") as tar:
            for m in tar.getmembers():
                parts = Path(m.name).parts
                inside = (
                    not m.name.startswith("/")
                    and ".." not in parts
                    and m.name.startswith(JIT_HOME_DIR + "/")
                )
                if not inside or not (m.isdir() or m.isfile()):
                    problems.append(
                        f"{m.name}: not a file or folder under {JIT_HOME_DIR}/"
                    )
                elif m.isfile():
                    if len(parts) != 4 or not m.name.endswith(".so"):
                        problems.append(f"{m.name}: not MODULE_DIR/MODULE.so")
                    else:
                        modules.append(m.name)
    except (tarfile.TarError, OSError) as exc:
        problems.append(f"{tarball}: {exc}")
    if not modules and not problems:
        problems.append(f"{tarball}: no module .so under {JIT_HOME_DIR}/")
    return modules, problems


def stage_jit(tarball: Path, root: Path = ROOT) -> Path:
    """``root/.carry-jit/``: the tarball and ``jit.json`` (its size, sha256
    and modules)."""
    modules, problems = jit_members(tarball)
    if problems:
        raise SystemExit(f"--jit {tarball}: {problems[0]}")
    folder = root / JIT_BATCH
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    shutil.copyfile(tarball, folder / JIT_FILE)
    index = {
        "file": JIT_FILE,
        "bytes": (folder / JIT_FILE).stat().st_size,
        "sha256": sha256(folder / JIT_FILE),
        "home": JIT_HOME_DIR,
        "modules": sorted(modules),
    }
    (folder / JIT_INDEX).write_text(json.dumps(index, indent=1) + "\n")
    return folder


def check_jit(root: Path = ROOT) -> list[str]:
    """What is wrong with the JIT batch (empty: fine, or none staged)."""
    folder = root / JIT_BATCH
    if not folder.exists():
        return []
    try:
        index = json.loads((folder / JIT_INDEX).read_text())
        path = folder / index["file"]
    except (OSError, ValueError, KeyError) as exc:
        return [f"{folder / JIT_INDEX}: {exc}"]
    if not path.is_file() or path.stat().st_size != index["bytes"]:
        return [f"{path} missing or of the wrong size"]
    if sha256(path) != index["sha256"]:
        return [f"{path}: sha256 differs from {JIT_INDEX}"]
    modules, problems = jit_members(path)
    if sorted(modules) != index["modules"]:
        problems.append(f"{path}: modules differ from {JIT_INDEX}")
    return problems


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=sys.executable, help="runs pip download")
    p.add_argument(
        "--batch-mib",
        type=float,
        default=56.0,
        help="a batch plus the working tree must stay under the 64 MiB a call carries",
    )
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument(
        "--gsm8k",
        type=Path,
        default=ROOT.parent / "shared/data/gsm8k",
        help="folder with GSM8K test.jsonl and train.jsonl, carried for the "
        "e2e run's client (the device reaches no network)",
    )
    p.add_argument("--check", action="store_true", help="only check the batches")
    p.add_argument(
        "--jit",
        type=Path,
        help="stage this JIT cache tarball (chain.sh jit:pack's jit-cache.tar.xz) "
        f"as {JIT_BATCH}/ and stop",
    )
    p.add_argument("--check-jit", action="store_true", help=f"only check {JIT_BATCH}/")
    args = p.parse_args(argv)
    if args.check_jit:
        problems = check_jit() if (ROOT / JIT_BATCH).exists() else [f"no {JIT_BATCH}/"]
        print("\n".join(problems) or f"{JIT_BATCH} matches its {JIT_INDEX}")
        return 1 if problems else 0
    if args.jit is not None:
        folder = stage_jit(args.jit)
        index = json.loads((folder / JIT_INDEX).read_text())
        print(
            f"{folder.name}: {len(index['modules'])} modules, "
            f"{index['bytes'] / 2**20:.1f} MiB"
        )
        return 0
    lock = read_lock()
    if args.check:
        problems = check(lock) + check_jit()
        print("\n".join(problems) or "batches match wheels.lock")
        return 1 if problems else 0
    download(lock, args.python)
    entries = pack(lock, args.jobs)
    extras = [pack_gsm8k(args.gsm8k)] if args.gsm8k else []
    folders = batch(entries, extras, args.batch_mib)
    report(folders, entries, working_tree_bytes())
    return 0


if __name__ == "__main__":
    sys.exit(main())
