"""scripts/device/jit_census.py on a made-up home and /tmp (no GPU)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "device" / "jit_census.py"
_spec = importlib.util.spec_from_file_location("jit_census", SCRIPT)
jc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(jc)

SINCE = 1_796_650_000.0  # 2026-12-07 13:26:40 UTC


def _file(path: Path, mtime: float, size: int = 1024) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    os.utime(path, (mtime, mtime))


def test_folders_by_size_with_the_times_of_their_writes(tmp_path):
    home, tmp = tmp_path / "root", tmp_path / "tmp"
    tvm = home / ".cache" / "tvm-ffi"
    _file(tvm / "sgl_kernel_jit_a__arch_9.0" / "a.so", SINCE + 60, 3 * 2**20)
    _file(tvm / "sgl_kernel_jit_b__arch_9.0" / "b.so", SINCE + 130, 2**20)
    _file(home / ".triton" / "cache" / "K1" / "fused_moe_kernel.cubin", SINCE + 100)
    _file(home / ".cache" / "pip" / "old.whl", SINCE - 10)  # before: not counted
    _file(tmp / "torchinductor_root" / "fx" / "g.py", SINCE + 90)
    _file(tmp / "dsdp" / "site17" / "x.py", SINCE + 5)  # the chain's own: skipped
    assert jc.SKIP == ("/tmp/dsdp", "/tmp/e2e", str(ROOT))
    lines = jc.census([home, tmp], SINCE, skip=(str(tmp / "dsdp"),))
    folders = [ln for ln in lines if " MiB " in ln]
    assert folders[0].endswith(f"  {tvm}") and "2 files 13:27:40-13:28:50" in folders[0]
    assert "4.0 MiB" in folders[0]
    assert sorted(ln.split("  ")[-1] for ln in folders[1:]) == sorted(
        [str(home / ".triton" / "cache"), str(tmp / "torchinductor_root")]
    )
    # Neither the old write nor the chain's own folder, by path (the
    # checkout's or the cache's path may hold these words themselves).
    left_out = (str(home / ".cache" / "pip"), str(tmp / "dsdp"))
    assert not any(p in ln for ln in lines for p in left_out)
    at = lines.index(f"== {tvm}: 2 entries, by last write")
    assert lines[at + 1].endswith("sgl_kernel_jit_a__arch_9.0")
    assert lines[at + 2].startswith("  13:28:50-13:28:50     1  sgl_kernel_jit_b")


def test_cli_writes_the_file_and_names_a_missing_root(tmp_path):
    home = tmp_path / "root"
    _file(home / ".tilelang" / "cache" / "k" / "kernel.so", SINCE + 1)
    out = tmp_path / "jit-census.txt"
    run = [sys.executable, str(SCRIPT), "--since", str(SINCE)]
    done = subprocess.run(
        [*run, "--out", str(out), str(home)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert f"  {home / '.tilelang' / 'cache'}" in out.read_text()
    done = subprocess.run(
        [*run, str(tmp_path / "nope")], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"jit_census: ROOT {tmp_path / 'nope'}: no such folder"
    )
