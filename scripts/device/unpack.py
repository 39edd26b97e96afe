"""On the device: unpack the carried batches into site folders (stdlib only).

Every call of the chain (scripts/device/README.md) runs

    python3 scripts/device/unpack.py [--smoke]

in the checkout on the device. It finds the ``.carry*`` batch this call
carried (its ``manifest.json`` lists every archive of every batch), copies
the parts it brought into ``$DSDP_STATE`` (default ``/tmp/dsdp``), and for
every archive whose parts are all there and that is not unpacked yet: joins
the parts, checks the sha256, and extracts it into
``$DSDP_STATE/<target>`` (``common``, ``site16``, ``site17``), all in
parallel. What is already done (a marker per archive) is skipped, so a call
repeated on the same machine does nothing twice, and a chain restarted on a
fresh machine (everything under /tmp lost) starts again from call 1. It also
lays out ``$DSDP_STATE/plugin``: this checkout's plugin and benchmark
packages (links) and the plugin's ``dist-info`` with its entry point, read
from ``pyproject.toml`` (what ``pip install`` would give SGLang's plugin
loader).

Then it prints one line per target (complete, or which batches are still
missing) and exits 0 when every target is complete, 3 when some are not, 4
when an archive failed its check or its extraction, 5 when ``--smoke``
(which imports the server's modules with each complete site) failed.

    python3 scripts/device/unpack.py pythonpath 17   # the PYTHONPATH of a site
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STATE = Path(os.environ.get("DSDP_STATE", "/tmp/dsdp"))
CARRY_PREFIX = ".carry"
MANIFEST = "manifest.json"
#: Imported with each complete site by --smoke: the server's own path.
SMOKE_MODULES = (
    "sglang.srt.entrypoints.http_server",
    "sglang.srt.entrypoints.openai.serving_chat",
    "sglang.srt.models.deepseek_v4",
    "sglang.srt.speculative.dspark_components.dspark_draft",
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    "sglang.srt.plugins.hook_registry",
    "sgl_kernel",
    "flashinfer.sampling",
    "tilelang",
    "deep_gemm",
    "cutlass",
    "jsonschema",
)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_manifest(root: Path = ROOT, state: Path = STATE) -> dict | None:
    """The manifest of a carried batch, else the one saved by an earlier
    call on this machine."""
    for folder in sorted(root.glob(CARRY_PREFIX + "[0-9]*")):
        path = folder / MANIFEST
        if path.is_file():
            return json.loads(path.read_text())
    saved = state / MANIFEST
    return json.loads(saved.read_text()) if saved.is_file() else None


def done_marker(state: Path, archive: dict) -> Path:
    return state / "done" / (archive["archive"] + "." + archive["sha256"][:16])


def collect(root: Path, state: Path, manifest: dict) -> int:
    """Copy the parts this call carried into the state folder; returns how
    many were copied."""
    copied = 0
    for archive in manifest["archives"] + manifest.get("extras", []):
        parts = archive.get("parts") or [dict(archive, offset=0)]
        for part in parts:
            src = root / part["batch"] / part["file"]
            dst = state / "parts" / part["file"]
            if not src.is_file() or (
                dst.is_file() and dst.stat().st_size == part["bytes"]
            ):
                continue
            if "archive" in archive and done_marker(state, archive).exists():
                continue
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst.with_suffix(dst.suffix + ".tmp"))
            dst.with_suffix(dst.suffix + ".tmp").rename(dst)
            copied += 1
    return copied


def extract_one(archive: dict, state: str) -> tuple[str, str | None]:
    """Join, check and extract one archive; ``(name, error or None)``."""
    state_dir = Path(state)
    parts = [state_dir / "parts" / p["file"] for p in archive["parts"]]
    joined = state_dir / "parts" / (archive["archive"] + ".joined")
    try:
        if len(parts) == 1:
            joined = parts[0]
        else:
            with joined.open("wb") as out:
                for part in parts:
                    with part.open("rb") as f:
                        shutil.copyfileobj(f, out, 1 << 22)
        got = sha256(joined)
        if got != archive["sha256"]:
            return archive["archive"], f"sha256 {got} != {archive['sha256']}"
        dest = state_dir / archive["target"]
        dest.mkdir(parents=True, exist_ok=True)
        for attempt in range(3):
            try:
                with tarfile.open(joined, "r:xz") as tar:
                    tar.extractall(dest, filter="data")
                break
            except FileExistsError:
                # Another archive of this target made the same folder at the
                # same moment; extracting again overwrites what is there.
                if attempt == 2:
                    raise
        marker = done_marker(state_dir, archive)
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        for path in {*parts, joined}:
            path.unlink(missing_ok=True)
        return archive["archive"], None
    except Exception as exc:  # reported, and the archive stays to do
        return archive["archive"], f"{type(exc).__name__}: {exc}"


def extract_ready(state: Path, manifest: dict, jobs: int) -> tuple[int, list[str]]:
    ready = [
        a
        for a in manifest["archives"]
        if not done_marker(state, a).exists()
        and all((state / "parts" / p["file"]).is_file() for p in a["parts"])
    ]
    ready.sort(key=lambda a: -a["bytes"])  # the big ones first
    if not ready:
        return 0, []
    with ProcessPoolExecutor(max(1, min(jobs, len(ready)))) as pool:
        results = list(pool.map(extract_one, ready, [str(state)] * len(ready)))
    errors = [f"{name}: {err}" for name, err in results if err]
    return len(ready) - len(errors), errors


def place_extras(state: Path, manifest: dict) -> None:
    """Extras (the GSM8K data): checked, then unpacked into ``extras/``."""
    for extra in manifest.get("extras", []):
        src = state / "parts" / extra["file"]
        marker = state / "done" / ("extra." + extra["sha256"][:16])
        if marker.exists() or not src.is_file():
            continue
        if sha256(src) != extra["sha256"]:
            print(f"extra {extra['file']}: sha256 mismatch", file=sys.stderr)
            continue
        dest = state / "extras"
        dest.mkdir(parents=True, exist_ok=True)
        if extra["file"].endswith(".tar.xz"):
            with tarfile.open(src, "r:xz") as tar:
                tar.extractall(dest, filter="data")
        else:
            shutil.copyfile(src, dest / extra["file"])
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()
        src.unlink()


def missing(state: Path, manifest: dict) -> dict[str, set[str]]:
    """``{target: batches still to carry}`` (empty set: complete)."""
    out: dict[str, set[str]] = {}
    for archive in manifest["archives"]:
        todo = out.setdefault(archive["target"], set())
        if done_marker(state, archive).exists():
            continue
        for part in archive["parts"]:
            if not (state / "parts" / part["file"]).is_file():
                todo.add(part["batch"])
    for extra in manifest.get("extras", []):
        marker = state / "done" / ("extra." + extra["sha256"][:16])
        if not marker.exists():
            out.setdefault("extras", set()).add(extra["batch"])
    return out


def plugin_layout(root: Path, state: Path) -> Path:
    """``$DSDP_STATE/plugin``: this checkout's packages and the plugin's
    dist-info with its entry points, as an install would give them."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    version = "0"
    for line in (root / "python/sglang_dspark_dp/package.py").read_text().splitlines():
        if line.startswith("__version__"):
            version = line.split("=", 1)[1].strip().strip("\"'")
    dest = state / "plugin"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    (dest / "sglang_dspark_dp").symlink_to(root / "python/sglang_dspark_dp")
    (dest / "sglang_dspark_dp_bench").symlink_to(root / "benchmark")
    info = dest / f"sglang_dspark_dp-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n"
    )
    lines = []
    for group, eps in project.get("entry-points", {}).items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in eps.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
    (info / "top_level.txt").write_text("sglang_dspark_dp\n")
    return dest


def pythonpath(release: str, state: Path = STATE) -> str:
    """The site of ``release`` (``16``/``17`` or ``0.5.17``) first, then the
    common wheels, cute-dsl's packages (its ``.pth`` is not read from
    PYTHONPATH) and the plugin."""
    site = "site" + release.rsplit(".", 1)[-1]
    dirs = [
        state / site,
        state / "common",
        state / "common/nvidia_cutlass_dsl/dsl_packages",
        state / "plugin",
    ]
    return ":".join(str(d) for d in dirs)


def smoke(state: Path, sites: list[str]) -> bool:
    ok = True
    code = (
        "import importlib, importlib.metadata as md, sys\n"
        "bad = []\n"
        "for m in sys.argv[1:]:\n"
        "    try: importlib.import_module(m)\n"
        "    except Exception as e: bad.append(f'{m}: {type(e).__name__}: {e}')\n"
        "eps = [e.name for e in md.entry_points(group='sglang.srt.plugins')]\n"
        "print('sglang', md.version('sglang'), 'transformers',"
        " md.version('transformers'), 'plugins', eps)\n"
        "print('\\n'.join('FAIL ' + b for b in bad) or 'all imports OK')\n"
        "sys.exit(1 if bad or 'dspark_dp' not in eps else 0)\n"
    )
    procs = {}
    for site in sites:
        env = dict(os.environ, PYTHONPATH=pythonpath(site, state))
        procs[site] = subprocess.Popen(
            [sys.executable, "-c", code, *SMOKE_MODULES],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    for site, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        lines = [
            ln for ln in out.splitlines() if ln.startswith(("sglang ", "FAIL", "all"))
        ]
        print(f"smoke {site}: rc={proc.returncode}: " + " | ".join(lines))
        ok = ok and proc.returncode == 0
    return ok


JIT_BATCH, JIT_INDEX = CARRY_PREFIX + "-jit", "jit.json"


def place_jit(root: Path, state: Path, home: Path) -> str | None:
    """The carried JIT batch (``stage.py --jit``), if any: its tarball
    checked (sha256) and its module ``.so`` files laid out under ``home``
    (``~/.cache/tvm-ffi``), where SGLang's ``load_jit`` loads a module it
    finds instead of building it. Once per machine. Returns a line to print."""
    index_path = root / JIT_BATCH / JIT_INDEX
    if not index_path.is_file():
        return None
    index = json.loads(index_path.read_text())
    marker = state / "done" / f"jit.{index['sha256'][:16]}"
    if marker.exists():
        return f"jit: {len(index['modules'])} modules already in {home / index['home']}"
    path = root / JIT_BATCH / index["file"]
    if sha256(path) != index["sha256"]:
        return f"ERROR jit: {path}: sha256 differs from {JIT_INDEX}; nothing placed"
    wanted = set(index["modules"])
    if any(
        ".." in Path(n).parts or not n.startswith(index["home"] + "/") for n in wanted
    ):
        return f"ERROR jit: {index_path}: a module outside {index['home']}/; nothing placed"
    with tarfile.open(path, "r:*") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and m.name in wanted]
        if len(members) != len(wanted):
            return f"ERROR jit: {path}: modules differ from {JIT_INDEX}; nothing placed"
        for m in members:
            dst = home / m.name
            dst.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            tmp = dst.with_suffix(".so.tmp")
            with tmp.open("wb") as f:
                shutil.copyfileobj(src, f)
            tmp.chmod(0o755)
            tmp.rename(dst)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return f"jit: {len(members)} modules placed in {home / index['home']}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "what", nargs="?", default="unpack", choices=["unpack", "pythonpath"]
    )
    p.add_argument("release", nargs="?", help="for pythonpath: 16 or 17")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = p.parse_args(argv)
    if args.what == "pythonpath":
        if not args.release:
            p.error("pythonpath needs a release: 16 or 17")
        print(pythonpath(args.release))
        return 0
    start = time.monotonic()
    manifest = find_manifest()
    if manifest is None:
        print("no .carry* batch here and none unpacked on this machine: carry .carry1")
        return 3
    STATE.mkdir(parents=True, exist_ok=True)
    (STATE / MANIFEST).write_text(json.dumps(manifest))
    copied = collect(ROOT, STATE, manifest)
    done, errors = extract_ready(STATE, manifest, args.jobs)
    place_extras(STATE, manifest)
    plugin_layout(ROOT, STATE)
    jit = place_jit(ROOT, STATE, Path.home())
    if jit:
        print(jit)
    print(
        f"unpack: {copied} parts carried in, {done} archives extracted "
        f"in {time.monotonic() - start:.1f} s into {STATE}"
    )
    for err in errors:
        print(f"ERROR {err}")
    todo = missing(STATE, manifest)
    for target, batches in sorted(todo.items()):
        state = "complete" if not batches else "needs " + " ".join(sorted(batches))
        print(f"  {target}: {state}")
    if errors:
        print("ERRORS: the archives above stay to do; carry their batches again")
        return 4
    complete = not any(todo.values())
    if args.smoke and complete:
        sites = sorted(t[4:] for t in todo if t.startswith("site"))
        if not smoke(STATE, sites):
            print("SMOKE FAILED")
            return 5
    print("ALL COMPLETE" if complete else "NOT COMPLETE")
    return 0 if complete else 3


if __name__ == "__main__":
    sys.exit(main())
