"""scripts/device/wheels.lock against the installed SGLang release.

The lock is what the device gets for a whole ``sglang serve`` (it has no
package registry). Read against the installed release's own metadata (its
wheel's ``Requires-Dist``, and the metadata of every carried distribution
installed here at the locked version), it must:

* give the release a site section, holding ``sglang`` at this version;
* account for every requirement of the release on the device's platform
  (carried, in the device image, or skipped with the lock's reason);
* satisfy every requirement, pinned or ranged, that the release or a carried
  distribution states on a carried distribution.

The staging scripts' pure parts (lock parsing, batching with split parts,
unpacking with the sha256 check, the resumable state) are tested here too,
on small made-up archives.
"""

from __future__ import annotations

import importlib
import io
import json
import lzma
import random
import re
import sys
import tarfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"


# The scripts are importable by name (unpack's worker processes need it).
sys.path.insert(0, str(DEVICE))
stage = importlib.import_module("stage")
unpack = importlib.import_module("unpack")

#: The device: CPython 3.12 on Linux x86_64 (KINDS.md, scripts/device/README.md).
DEVICE_MARKERS = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def installed_sglang() -> str:
    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        pytest.skip("SGLang is not installed in this Python")


@pytest.fixture(scope="module")
def lock():
    return stage.read_lock()


@pytest.fixture(scope="module")
def site(lock):
    version = installed_sglang()
    try:
        return stage.site_entries(lock, version)
    except KeyError:
        pytest.skip(f"the device run stages 0.5.16 and 0.5.17 only, not {version}")


def requirements(dist: str, extras: frozenset[str] = frozenset()):
    from packaging.requirements import Requirement

    out = []
    for raw in metadata.requires(dist) or []:
        req = Requirement(raw)
        if req.marker is not None and not any(
            req.marker.evaluate(dict(DEVICE_MARKERS, extra=e)) for e in extras | {""}
        ):
            continue
        out.append(req)
    return out


def test_the_site_holds_this_release(site):
    assert site["sglang"] == installed_sglang()


def test_every_requirement_of_the_release_is_accounted_for(lock, site):
    from packaging.utils import canonicalize_name

    accounted = set(site) | set(lock["image"]) | set(lock["skip"])
    names = {canonicalize_name(r.name) for r in requirements("sglang")}
    assert names - accounted == set()


def test_every_stated_requirement_on_a_carried_wheel_holds(site):
    """The release's pins and ranges, and those of every carried
    distribution installed here at its locked version, with the extras the
    requirement asks for (``flashinfer_python[cu13]`` brings the cu13
    cute-dsl libraries)."""
    from packaging.utils import canonicalize_name

    checked, problems = 0, []
    todo = [("sglang", frozenset())]
    seen = set()
    while todo:
        dist, extras = todo.pop()
        if (dist, extras) in seen:
            continue
        seen.add((dist, extras))
        for req in requirements(dist, extras):
            name = canonicalize_name(req.name)
            if name not in site:
                continue
            checked += 1
            if not req.specifier.contains(site[name], prereleases=True):
                problems.append(f"{dist} wants {req}, lock has {site[name]}")
            try:
                here = metadata.version(name)
            except metadata.PackageNotFoundError:
                continue
            if here == site[name]:
                todo.append((name, frozenset(req.extras)))
    assert not problems
    assert checked >= 20  # the walk reached the carried distributions


def test_pins_of_the_release_are_the_locked_versions(site):
    pinned = {}
    for req in requirements("sglang"):
        specs = list(req.specifier)
        if len(specs) == 1 and specs[0].operator == "==":
            pinned[req.name] = specs[0].version
    from packaging.utils import canonicalize_name

    carried = {n: v for n, v in pinned.items() if canonicalize_name(n) in site}
    assert len(carried) >= 10
    for name, version in carried.items():
        assert site[canonicalize_name(name)] == version, name


# ---------------------------------------------------------------- the lock


@pytest.mark.parametrize(
    "text, message",
    [
        ("torch==1\n", "before a [section]"),
        ("[common]\ntorch\n", "is not name==version"),
        ("[common]\ntorch==1\n[site17]\ntorch==2\n", "already in [common]"),
        ("[image]\ntorch==1\n", "takes bare names"),
        ("[site16]\nA_b==1\n[site16]\na-B==2\n", "already in [site16]"),
    ],
)
def test_a_bad_lock_line_is_refused_by_line(text, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        stage.parse_lock(text)


def test_sites_may_share_a_name_at_their_own_versions():
    lock = stage.parse_lock("[common]\nx==1\n[site16]\ns==6\n[site17]\ns==7\n")
    assert stage.site_entries(lock, "0.5.16") == {"x": "1", "s": "6"}
    assert stage.site_entries(lock, "17") == {"x": "1", "s": "7"}
    with pytest.raises(KeyError, match="site18"):
        stage.site_entries(lock, "0.5.18")


# ------------------------------------------------- batches and unpacking


def make_archive(folder: Path, name: str, files: dict[str, bytes]) -> dict:
    path = folder / name
    with lzma.open(path, "wb") as xz, tarfile.open(fileobj=xz, mode="w") as tar:
        for member, data in files.items():
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    if "--" not in name:
        return {}
    return {
        "archive": name,
        "target": name.split("--")[0],
        "wheel": name.split("--")[1].removesuffix(".tar.xz") + ".whl",
        "wheel_bytes": 0,
        "bytes": path.stat().st_size,
        "sha256": stage.sha256(path),
    }


@pytest.fixture
def staged(tmp_path, monkeypatch):
    """Three archives, one of them larger than a batch: batches of 4 KiB."""
    root, archives = tmp_path / "repo", tmp_path / "archives"
    root.mkdir()
    archives.mkdir()
    lock = root / "wheels.lock"
    lock.write_text("[common]\nbig==1\nsmall==1\n[site17]\nsglang==0.5.17\n")
    monkeypatch.setattr(stage, "ROOT", root)
    monkeypatch.setattr(stage, "ARCHIVES", archives)
    monkeypatch.setattr(stage, "LOCK", lock)
    monkeypatch.setattr(
        stage, "read_lock", lambda path=lock: stage.parse_lock(path.read_text())
    )
    noise = random.Random(0).randbytes(30000)  # does not compress
    entries = [
        make_archive(archives, "common--big-1-py3-none-any.tar.xz", {"big/x.so": noise}),
        make_archive(archives, "common--small-1-py3-none-any.tar.xz", {"small/__init__.py": b"A = 1\n"}),
        make_archive(archives, "site17--sglang-0.5.17-py3-none-any.tar.xz", {"sglang/__init__.py": b""}),
    ]  # fmt: skip
    extra = tmp_path / "gsm8k.tar.xz"
    make_archive(tmp_path, "gsm8k.tar.xz", {"gsm8k/test.jsonl": b"{}\n"})
    folders = stage.batch(entries, [extra], limit_mib=4 / 1024)
    return root, folders, entries


def carry(root: Path, folders: list[Path], keep: str, dest: Path) -> Path:
    """A device checkout that carried one batch only."""
    dest.mkdir(exist_ok=True)
    for f in dest.glob(".carry*"):
        f.unlink()
    (dest / keep).symlink_to(root / keep)
    return dest


def test_a_large_archive_is_cut_into_parts_across_batches(staged):
    root, folders, entries = staged
    manifest = json.loads((folders[0] / stage.MANIFEST).read_text())
    big = next(
        a for a in manifest["archives"] if a["archive"].startswith("common--big")
    )
    assert len(big["parts"]) >= 2
    assert sum(p["bytes"] for p in big["parts"]) == big["bytes"]
    assert len({p["batch"] for p in big["parts"]}) >= 2
    for folder in folders:
        size = sum(
            p.stat().st_size for p in folder.iterdir() if p.name != "manifest.json"
        )
        assert size <= 4096
    assert stage.check(stage.read_lock()) == []


def test_unpacking_batch_by_batch_is_resumable_and_checked(staged, tmp_path):
    root, folders, _ = staged
    state = tmp_path / "state"
    device = tmp_path / "device"
    seen_missing = []
    for folder in folders:
        checkout = carry(root, folders, folder.name, device)
        manifest = unpack.find_manifest(checkout, state)
        state.mkdir(exist_ok=True)
        unpack.collect(checkout, state, manifest)
        done, errors = unpack.extract_ready(state, manifest, jobs=2)
        unpack.place_extras(state, manifest)
        assert errors == []
        seen_missing.append(unpack.missing(state, manifest))
    assert not any(seen_missing[-1].values())
    assert any(any(m.values()) for m in seen_missing[:-1])
    assert (state / "common/small/__init__.py").read_bytes() == b"A = 1\n"
    assert (state / "site17/sglang/__init__.py").exists()
    assert (state / "extras/gsm8k/test.jsonl").exists()
    # Again on the same machine: nothing left to do.
    assert unpack.extract_ready(state, manifest, jobs=2) == (0, [])
    # A fresh machine that got only the last batch: it says what is missing.
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    unpack.collect(device, fresh, manifest)
    unpack.extract_ready(fresh, manifest, jobs=1)
    todo = unpack.missing(fresh, manifest)
    assert folders[0].name in set().union(*todo.values())


def test_a_corrupt_part_is_not_unpacked(staged, tmp_path):
    root, folders, _ = staged
    state = tmp_path / "state"
    state.mkdir()
    manifest = json.loads((folders[0] / stage.MANIFEST).read_text())
    small = next(a for a in manifest["archives"] if "small" in a["archive"])
    part = small["parts"][0]
    (state / "parts").mkdir()
    data = bytearray((root / part["batch"] / part["file"]).read_bytes())
    data[-1] ^= 0xFF
    (state / "parts" / part["file"]).write_bytes(bytes(data))
    done, errors = unpack.extract_ready(state, {"archives": [small]}, jobs=1)
    assert done == 0 and len(errors) == 1 and "sha256" in errors[0]
    assert not unpack.done_marker(state, small).exists()


def test_the_plugin_layout_gives_sglang_the_entry_point(tmp_path):
    dest = unpack.plugin_layout(ROOT, tmp_path)
    dists = list(metadata.distributions(path=[str(dest)]))
    assert [d.metadata["Name"] for d in dists] == ["sglang-dspark-dp"]
    eps = {(e.group, e.name, e.value) for e in dists[0].entry_points}
    assert (
        "sglang.srt.plugins",
        "dspark_dp",
        "sglang_dspark_dp.plugin:register",
    ) in eps
    assert (dest / "sglang_dspark_dp/plugin.py").is_file()
    assert (dest / "sglang_dspark_dp_bench/gsm8k/client.py").is_file()


def test_pythonpath_puts_the_site_first_and_cute_dsl_packages_on_it():
    parts = unpack.pythonpath("0.5.17", Path("/s")).split(":")
    assert parts == [
        "/s/site17",
        "/s/common",
        "/s/common/nvidia_cutlass_dsl/dsl_packages",
        "/s/plugin",
    ]
    assert unpack.pythonpath("16", Path("/s")).startswith("/s/site16:")
