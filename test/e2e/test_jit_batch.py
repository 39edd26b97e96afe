"""The JIT batch: stage.py --jit here, unpack.py's place_jit on the device
(no GPU: a made-up tvm-ffi cache)."""

from __future__ import annotations

import importlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEVICE = ROOT / "scripts" / "device"
sys.path.insert(0, str(DEVICE))
stage = importlib.import_module("stage")
unpack = importlib.import_module("unpack")

MODULE = "sgl_kernel_jit_dpsk_v4_topk_v1_512_true_5664b3d3828d566b"
FOLDER = f"{MODULE}__arch_9.0a__tvmffi_0.1.11"
SO = f".cache/tvm-ffi/{FOLDER}/{MODULE}.so"


def _tarball(path: Path, members: dict[str, bytes]) -> Path:
    """What chain.sh's jit:pack writes: the .so files, paths from $HOME."""
    with tarfile.open(path, "w:xz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_staged_here_checked_and_placed_on_the_device(tmp_path):
    checkout, state, home = tmp_path / "checkout", tmp_path / "dsdp", tmp_path / "home"
    checkout.mkdir()
    tarball = _tarball(tmp_path / "jit-cache.tar.xz", {SO: b"\x7fELF module"})
    folder = stage.stage_jit(tarball, checkout)
    assert folder == checkout / ".carry-jit"
    index = json.loads((folder / "jit.json").read_text())
    assert index["modules"] == [SO] and index["home"] == ".cache/tvm-ffi"
    assert stage.check_jit(checkout) == []
    # The wheel batches' readers pass it by: it is no wheel batch.
    assert unpack.find_manifest(checkout, state) is None
    line = unpack.place_jit(checkout, state, home)
    assert line == f"jit: 1 modules placed in {home / '.cache/tvm-ffi'}"
    assert (home / SO).read_bytes() == b"\x7fELF module"
    assert unpack.place_jit(checkout, state, home).startswith("jit: 1 modules already")
    # A call that carried no JIT batch places nothing.
    assert unpack.place_jit(tmp_path / "elsewhere", state, home) is None


def test_a_changed_batch_is_caught_on_both_sides(tmp_path):
    checkout, home = tmp_path / "checkout", tmp_path / "home"
    checkout.mkdir()
    tarball = _tarball(tmp_path / "jit-cache.tar.xz", {SO: b"module"})
    folder = stage.stage_jit(tarball, checkout)
    _tarball(folder / "jit-cache.tar.xz", {SO: b"another module"})
    problems = stage.check_jit(checkout)
    assert problems and "jit-cache.tar.xz" in problems[0]
    line = unpack.place_jit(checkout, tmp_path / "dsdp", home)
    assert line.startswith("ERROR jit: ") and line.endswith("; nothing placed")
    assert not (home / SO).exists()


def test_a_tarball_with_anything_else_is_refused_in_one_line(tmp_path):
    cases = {
        "escape": {"../.bashrc": b"x"},
        "not a module": {".cache/tvm-ffi/build.ninja": b"x"},
        "another cache": {".triton/cache/K/k.so": b"x"},
    }
    for why, members in cases.items():
        tarball = _tarball(tmp_path / f"{why}.tar.xz", members)
        _, problems = stage.jit_members(tarball)
        assert problems, why
        done = subprocess.run(
            [sys.executable, str(DEVICE / "stage.py"), "--jit", str(tarball)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 1 and done.stdout == ""
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"--jit {tarball}: "), err
    assert stage.jit_members(_tarball(tmp_path / "empty.tar.xz", {}))[1]


def test_staging_warns_when_a_batch_and_the_tree_exceed_a_call(tmp_path, capsys):
    batch = tmp_path / ".carry1"
    batch.mkdir()
    (batch / "manifest.json").write_text("{}")
    with (batch / "big.tar.xz").open("wb") as f:  # sparse: no disk used
        f.truncate(60 * 2**20)
    entries = [{"wheel_bytes": 1, "bytes": 60 * 2**20}]
    stage.report([batch], entries, tree_bytes=3 * 2**20)
    assert "WARNING" not in capsys.readouterr().out
    stage.report([batch], entries, tree_bytes=5 * 2**20)
    out = capsys.readouterr().out
    assert (
        "WARNING .carry1: with the working tree over the 64 MiB a call carries" in out
    )
