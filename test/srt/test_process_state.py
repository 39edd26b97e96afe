"""A probe's answer never depends on the process that asks.

``doctor --json``'s verdicts (every repair's outcome and reason, every
upstream change's state) in a fresh process are the reference; the same
report must come back in a process whose default ``torch.distributed``
group (gloo, 2 ranks) was initialised before the plugin loaded, or after;
with no GPU visible (``CUDA_VISIBLE_DEVICES=""``); and with a torch default
device set (``meta``: a probe that made a tensor without saying where would
get one with no data). Each runs in a fresh process forked from one that
imported SGLang and nothing of the plugin, as ``sglang serve`` starts.
"""

from __future__ import annotations

import json
import socket
import textwrap

import pytest
from known_releases import backport_fixes
from srt_helpers import run_python

REPORT = textwrap.dedent(
    """
    import json
    def report(tag):
        from sglang_dspark_dp.cli.doctor import doctor_report
        r = doctor_report()
        out = {
            "repairs": [(s["repair"], s["outcome"], s["reason"]) for s in r["repairs"]],
            "changes": [(c["change"], c["state"]) for c in r["changes"]],
        }
        print("REPORT", tag, json.dumps(out), flush=True)
    """
)

#: Two ranks of a gloo default group: rank 1 is a fork of rank 0; both
#: report. ``{order}`` is "before" or "after" load_plugins().
GROUP = textwrap.dedent(
    """
    import os
    import torch.distributed as dist
    from sglang.srt.plugins import load_plugins
    rank = 0 if os.fork() else 1
    def join():
        dist.init_process_group(
            "gloo", init_method="tcp://127.0.0.1:{port}", rank=rank, world_size=2
        )
    if "{order}" == "before":
        join()
        load_plugins()
    else:
        load_plugins()
        join()
    assert dist.is_initialized() and dist.get_world_size() == 2
    for turn in range(2):  # one rank at a time: they share this stdout
        if turn == rank:
            report(f"rank{{rank}}")
        dist.barrier()
    dist.destroy_process_group()
    if rank == 1:
        os._exit(0)
    os.wait()
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reports(proc) -> dict[str, dict]:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = {}
    for line in proc.stdout.splitlines():
        if line.startswith("REPORT "):
            _, tag, payload = line.split(" ", 2)
            out[tag] = json.loads(payload)
    return out


@pytest.fixture(scope="module")
def fresh():
    if backport_fixes():
        pytest.skip("backport mode: the plugin is off")
    got = reports(run_python(REPORT + "report('fresh')\n"))["fresh"]
    assert got["repairs"] and got["changes"]
    # Every repair decided: none failed to set up in a fresh process.
    assert all("could not" not in reason for _, _, reason in got["repairs"]), got
    return got


@pytest.mark.parametrize("order", ["before", "after"])
def test_torch_distributed_initialised_around_the_load(fresh, order):
    proc = run_python(REPORT + GROUP.format(port=free_port(), order=order), timeout=300)
    got = reports(proc)
    assert set(got) == {"rank0", "rank1"}, proc.stdout[-2000:]
    assert got["rank0"] == fresh
    assert got["rank1"] == fresh


def test_no_gpu_visible(fresh):
    got = reports(
        run_python(REPORT + "report('nogpu')\n", env={"CUDA_VISIBLE_DEVICES": ""})
    )
    assert got["nogpu"] == fresh


def test_a_default_device_set(fresh):
    code = "import torch\ntorch.set_default_device('meta')\n" + REPORT
    got = reports(run_python(code + "report('meta')\n"))
    assert got["meta"] == fresh
